"""The tiny decoder's graphs (kind ``tiny-decoder``): spec, AOTInductor engines, the stream's --decoder choice, and
a pair of two decoders refused (its ONNX Runtime check: tests/export/test_decoder.py)."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.decoder_spec import CALLS, RGB, DecoderSpec, TinyDecoderSpec
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.bench import BenchOptions, run_bench
from wan_trt.engines.runtime.decoder import DecoderStream
from wan_trt.errors import WanTrtError
from wan_trt.export.decoder import read_decoder
from wan_trt.graphs import spec_from_dict
from wan_trt.model import build_decoder, build_tiny_decoder
from wan_trt.validate.check import CheckOptions
from wan_trt.validate.check_decoder import check_target, stream_latents

CFG = "universal-small"


def test_spec_describes_both_calls_with_the_memory_blocks_histories_and_round_trips():
    cfg = load_config(CFG)
    first, steady = (TinyDecoderSpec.from_config(cfg, "bf16", call) for call in CALLS)
    assert first.input_names == ["latents"] and len(steady.inputs) == 1 + len(steady.histories) == 10
    assert first.tensor(RGB).shape == (1, 3, 9, 32, 48) and steady.tensor(RGB).shape == (1, 3, 12, 32, 48)
    shapes = [steady.tensor(i).shape for i, _ in steady.histories]  # [1, h', w', C]: channels last
    assert shapes == [(1, 4, 6, 256)] * 3 + [(1, 8, 12, 128)] * 3 + [(1, 16, 24, 64)] * 3
    assert [first.tensor(o).shape for _, o in first.histories] == shapes
    for spec in (first, steady):
        again = spec_from_dict(json.loads(json.dumps(spec.to_dict())))
        assert type(again) is TinyDecoderSpec and again.fingerprint() == spec.fingerprint()
    assert steady.fingerprint() != DecoderSpec.from_config(cfg, "bf16", "steady").fingerprint()


def test_a_pair_of_two_decoders_is_refused(tiny_decoder_export, decoder_export, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(tiny_decoder_export, mixed)
    shutil.rmtree(mixed / "steady")
    shutil.copytree(decoder_export / "steady", mixed / "steady")
    with pytest.raises(WanTrtError, match=r"first/ holds a graph of the tiny-decoder and steady/ one of the decoder; "
                                          r"re-export both with `wan-trt export --graph decoder --overwrite`"):
        read_decoder(mixed)
    cfg = load_config(CFG)
    tiny, wan = build_tiny_decoder(cfg), build_decoder(cfg)
    with pytest.raises(WanTrtError, match="runs a graph of the tiny-decoder, its steady runner .* of the decoder"):
        DecoderStream(TorchRunner(tiny, TinyDecoderSpec.from_config(cfg, "fp32", "first")),
                      TorchRunner(wan, DecoderSpec.from_config(cfg, "fp32", "steady")))


def test_aoti_engines_build_check_decode_as_pytorch_and_bench(tiny_decoder_export, tiny_decoder_aoti, plain_export):
    engine = tiny_decoder_aoti
    report = check_target(engine, CheckOptions(blocks=4, save_results=False))
    assert report.ok and len(report.stream) == 4, report.table()
    cfg = load_config(CFG)
    latents = stream_latents(TinyDecoderSpec.from_config(cfg, "fp32"), 4, seed=5)
    blocks = [latents[:, :, i:i + 3] for i in range(0, 12, 3)]
    with DecoderStream.from_engine(engine, "aoti", "cpu") as stream:
        frames = torch.cat([stream.decode(z) for z in blocks])
    reference = build_tiny_decoder(cfg, seed=6)
    runners = [TorchRunner(reference, TinyDecoderSpec.from_config(cfg, "fp32", call)) for call in CALLS]
    with DecoderStream(*runners) as stream:
        expected = torch.cat([stream.decode(z) for z in blocks])
    assert frames.dtype == torch.uint8 and frames.shape == (9 + 12 * 3, 32, 48, 3)
    assert frames.float().std() > 10  # pictures, not a constant
    assert (frames.int() - expected.int()).abs().max() <= 1
    options = BenchOptions(backends=("torch-eager",), blocks=3, device="cpu", decoder=tiny_decoder_export,
                           decoder_engine=engine, end_to_end=("torch-eager",))
    bench = run_bench(plain_export, options)
    assert bench["decoder"]["graph"] == "tiny-decoder" and list(bench["decoder"]["rows"]) == ["aoti"]
    assert 0 < bench["decoder"]["flops_per_block"]["steady"]
    assert bench["end_to_end"]["torch-eager+decoder"]["stage_ms"]["decode"] > 0


def test_stream_with_the_tiny_decoder_writes_its_video(tmp_path):
    out = tmp_path / "stream"
    res = CliRunner().invoke(main, ["stream", "--config", CFG, "--blocks", "3", "--out", str(out),
                                    "--decoder", "tiny"])
    assert res.exit_code == 0, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["video_frames"] == 9 + 12 * 2 and report["inputs"]["decoder"] == "tiny-decoder"
    import av
    with av.open(str(out / "video.mp4")) as video:
        assert sum(1 for _ in video.decode(video=0)) == 33
    for decoder in ("tiny", "wan"):  # the default given by name too: an option the run would not use
        res = CliRunner().invoke(main, ["stream", "--config", CFG, "--blocks", "1", "--decoder", decoder])
        assert res.exit_code == 1 and f"--decoder {decoder}: the video decoder runs only when" in res.output


def test_a_plugins_export_of_the_tiny_decoder_is_refused_saying_it_has_no_fused_ops(tmp_path):
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--graph", "tiny-decoder", "--ops", "plugins",
                                    "--out", str(tmp_path / "x")])
    assert res.exit_code == 1 and "the tiny decoder has none); drop --ops plugins" in res.output, res.output


def test_a_wan_vae_given_to_the_tiny_decoders_export_is_refused(tmp_path):
    from wan_trt.model.vae import DecoderConfig, VideoDecoder
    torch.save(VideoDecoder(DecoderConfig(dim=8)).state_dict(), tmp_path / "Wan2.1_VAE.pth")
    res = CliRunner().invoke(main, ["export", "--config", CFG, "--graph", "tiny-decoder", "--out",
                                    str(tmp_path / "x"), "--vae-weights", str(tmp_path / "Wan2.1_VAE.pth")])
    assert res.exit_code == 1 and "taew2_1.pth" in res.output and "missing key(s)" in res.output, res.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("graph", ["", "steady"], ids=["pair", "one-graph"])
def test_a_plugins_build_of_the_tiny_decoder_is_refused(tiny_decoder_export, graph):
    """The tiny decoder has no fused ops: `build --ops plugins` would have built the plain graph under the
    aoti-plugins name (of the pair, and of one of its graphs given alone)."""
    res = CliRunner().invoke(main, ["build", str(tiny_decoder_export / graph), "--backend", "aoti", "--ops", "plugins",
                                    "--device", "cpu", "--fp32"])
    assert res.exit_code == 1 and "holds a graph of the tiny-decoder, which has no fused ops" in res.output, res.output
    assert not list(tiny_decoder_export.glob("*/engine_aoti_plugins*"))
