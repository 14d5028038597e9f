"""The C++ runtime (engines/cpp, driven by engines/runtime/cpp.py) over the CPU AOTInductor package:
the same latents as the Python session, and the same refusals."""
import os
import re
from pathlib import Path

import pytest
import torch

from wan_trt.engines.backends.aoti import AotiRunner
from wan_trt.engines.runtime.cpp import build_cpp, run_wan_stream, write_stream_inputs
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest, reference_model
from wan_trt.stream import NoiseSource, synthetic_stream
from wan_trt.validate.metrics import error_stats
from wan_trt.validate.stream import reference_stream

BLOCKS = 8


@pytest.fixture(scope="module")
def aoti_fp16(tmp_path_factory):
    """universal-small fp16 export (no ONNX graph) and its CPU AOTInductor package (built once: ~40 s): a
    stream whose dtype holds up to 65504."""
    from wan_trt.config_load import load_config
    from wan_trt.engines.backends.aoti import build_aoti
    from wan_trt.export.transformer import export_transformer
    root = tmp_path_factory.mktemp("aoti_fp16")
    export_transformer(load_config("universal-small"), root / "export", "fp16", seed=2, onnx=False)
    return root / "export", build_aoti(root / "export", device="cpu")


def test_build_cpp_with_tensorrt_stops_where_tensorrt_is_missing(tmp_path):
    """-DWAN_TRT_WITH_TENSORRT=ON without TensorRT printed a CMake warning, which build_cpp dropped, and built a
    runtime without the TensorRT runner: build_cpp(tensorrt=True) returned as if it held one. CMake stops now, and
    build_cpp says why in one error."""
    import ctypes.util
    import importlib.util
    if importlib.util.find_spec("tensorrt") is not None or ctypes.util.find_library("nvinfer") is not None:
        pytest.skip("TensorRT is installed here")
    with pytest.raises(WanTrtError, match=r"^cmake configure failed: wan-trt: -DWAN_TRT_WITH_TENSORRT=ON, but "
                                          r"TensorRT's headers \(NvInfer\.h\) are not found.*install TensorRT"):
        build_cpp(tmp_path / "build", tensorrt=True)
    assert not (tmp_path / "build" / "wan_stream").exists()


def test_build_cpp_without_cmake_says_it_needs_cmake(tmp_path, monkeypatch):
    """Without cmake on PATH build_cpp ended in a raw FileNotFoundError."""
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder without cmake
    with pytest.raises(WanTrtError, match=r"^building the C\+\+ runtime needs cmake \(3\.18 or later\), which is not "
                                          r"on PATH; install it"):
        build_cpp(tmp_path / "build")


def test_python_and_cpp_runtimes_agree_and_match_the_reference(aoti, wan_stream, tmp_path):
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    inputs = synthetic_stream(manifest.spec.config, BLOCKS, seed=9)
    with AotiRunner(engine, manifest) as runner:
        python = torch.cat([r.latents for r in stream_blocks(StreamingSession(runner, noise=NoiseSource(4)),
                                                             inputs, BLOCKS)], dim=2)
    run = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), BLOCKS,
                         tmp_path / "out.pt", seed=4)
    cpp = run.latents
    assert len(run.block_ms) == BLOCKS and all(set(s) == {"passes", "clean", "checks", "commit"} for s in run.stage_ms)
    torch.testing.assert_close(cpp, python, rtol=0, atol=1e-6)
    expected = torch.cat(reference_stream(reference_model(manifest, torch.float32, "cpu"), inputs, BLOCKS, 4), dim=2)
    for b in range(BLOCKS):
        f = slice(3 * b, 3 * b + 3)
        stats = error_stats(cpp[:, :, f], expected[:, :, f])
        assert stats.rel_l2 < 1e-3 and stats.non_finite == 0, (b, stats)


def test_cpp_runtime_commits_a_window_shorter_than_the_block(tmp_path, wan_stream):
    """gta_drive keeps P = 1 previous frame of a 3-frame block: the commit copies the last frame of
    each layer's K/V (not a swap). The C++ stream must follow upstream's rolling caches."""
    from wan_trt.config_load import load_config
    from wan_trt.engines.backends.aoti import build_aoti
    from wan_trt.export.transformer import export_transformer
    cfg = load_config("gta_drive-small")
    assert 0 < cfg.prev_frames < cfg.block_frames
    export_transformer(cfg, tmp_path / "export", "fp32", seed=3, onnx=False)
    engine = build_aoti(tmp_path / "export", device="cpu")
    manifest, blocks = Manifest.read(tmp_path / "export"), 4
    inputs = synthetic_stream(cfg, blocks, seed=5)
    cpp = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), blocks,
                         tmp_path / "out.pt", seed=4).latents
    expected = torch.cat(reference_stream(reference_model(manifest, torch.float32, "cpu"), inputs, blocks, 4), dim=2)
    for b in range(blocks):
        stats = error_stats(cpp[:, :, 3 * b:3 * b + 3], expected[:, :, 3 * b:3 * b + 3])
        assert stats.rel_l2 < 1e-5 and stats.non_finite == 0, (b, stats)


@pytest.mark.parametrize("start_block", [339, 2498])
def test_cpp_runtime_equals_python_across_upstreams_table_ends(aoti, wan_stream, tmp_path, start_block):
    """Started just before frame 1024 / 7500: both runtimes form the rotary factors from the same
    frequencies with the C library's cos/sin; the latents agree as at frame 0."""
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    inputs = synthetic_stream(manifest.spec.config, 4, seed=9, first_block=start_block)
    with AotiRunner(engine, manifest) as runner:
        python = torch.cat([r.latents for r in stream_blocks(StreamingSession(runner, noise=NoiseSource(4)),
                                                             inputs, 4, start_block=start_block)], dim=2)
    cpp = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 4,
                         tmp_path / "out.pt", seed=4, start_block=start_block).latents
    torch.testing.assert_close(cpp, python, rtol=0, atol=1e-6)
    expected = torch.cat(reference_stream(reference_model(manifest, torch.float32, "cpu"), inputs, 4, 4,
                                          start_block=start_block), dim=2)
    assert error_stats(cpp, expected).rel_l2 < 1e-3


def test_cpp_runtime_refuses_non_finite_input_and_blocks(aoti, wan_stream, tmp_path):
    """NaN conditioning is refused as input; finite but huge conditioning overflows inside the model and
    the block is refused. Both name the block, exit 1 and write no latents."""
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    for value, message in ((float("nan"), r"error: cond_concat of block 1 holds non-finite values"),
                           (3e38, r"error: \w+ of block 1 came out non-finite .*not committed")):
        inputs = synthetic_stream(cfg, 2, seed=9)
        inputs.cond_concat[:, 4:, cfg.block_frames:] = value
        out = tmp_path / "out.pt"
        with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): " + message):
            run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 2, out)
        assert not out.exists()


@pytest.mark.parametrize("field, where", [("cond_concat", "of block 1"), ("mouse", "of block 1"),
                                          ("visual_context", "of the stream")])
def test_a_finite_input_beyond_the_engines_dtype_is_named_as_python_names_it(aoti_fp16, wan_stream, tmp_path,
                                                                              field, where):
    """A finite -1e5 in an fp16 engine's inputs was 'holds non-finite values (NaN or Inf)' from C++: its finiteness
    was judged after the conversion to fp16, which made it -Inf. Both runtimes judge the values as given and say
    they lie beyond float16's range, with the largest magnitude and float16's largest."""
    export_dir, engine = aoti_fp16
    manifest = Manifest.read(export_dir)
    cfg = manifest.spec.config
    inputs = synthetic_stream(cfg, 2, seed=9)
    at_block_1 = {"cond_concat": (0, 5, cfg.block_frames + 1, 0, 0), "mouse": (0, 10, 0), "visual_context": (0, 0, 0)}
    getattr(inputs, field)[at_block_1[field]] = -1e5
    with AotiRunner(engine, manifest) as runner, pytest.raises(WanTrtError) as python:
        stream_blocks(StreamingSession(runner), inputs, 2)
    out = tmp_path / "out.pt"
    with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): error: ") as cpp:
        run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 2, out)
    expected = (f"{field} {where} holds values beyond float16's range (largest magnitude 100000, float16 holds up to "
                "65504); scale them down")
    assert str(cpp.value).partition("error: ")[2].strip() == expected
    assert str(python.value) == expected.replace("float16", "torch.float16")
    assert not out.exists()


def test_cpp_session_refuses_a_block_and_then_streams_it_as_if_never_offered(aoti, wan_stream, tmp_path):
    """The C++ session stages the next block's rotary tables and first noise during a block's clean pass and
    checks the inputs with the outputs: a block refused for a NaN input, then for an output that overflowed,
    leaves nothing behind (caches, action history, staged tables and noise), so offering it again streams
    what wan_stream streams (engines/cpp/tests/session_retry.cpp)."""
    import subprocess
    export_dir, engine = aoti
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 4, seed=9), tmp_path / "in.pt")
    run = subprocess.run([str(wan_stream.parent / "session_retry"), str(engine), str(inputs), "4",
                          str(tmp_path / "retry.pt")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("refused: ") == 2, run.stdout
    straight = run_wan_stream(wan_stream, engine, inputs, 4, tmp_path / "out.pt", seed=0).latents
    torch.testing.assert_close(torch.load(tmp_path / "retry.pt"), straight, rtol=0, atol=0)


@pytest.mark.parametrize("version, contract, fix", [
    (1, "a RoPE table with a frame offset input", "re-export and rebuild"),
    (2, "one stacked tensor per cache", "re-export and rebuild"),
    (3, "no engine hash", "rebuild with `wan-trt build`, which keeps an up-to-date engine"),
    (4, "no hash of its own", "rebuild with `wan-trt build`, which keeps an up-to-date engine"),
    (5, "no device", "rebuild with `wan-trt build`, which keeps an up-to-date engine")])
def test_cpp_runtime_refuses_a_runtime_file_of_an_older_contract(aoti, wan_stream, tmp_path, version, contract, fix):
    """Engines built before the rotary inputs (an int32 rope_offset) or before one cache tensor per
    layer: re-export and rebuild; runtime files without the engine's hash or their own: rebuild (it rewrites them)."""
    import shutil
    export_dir, engine = aoti
    old = tmp_path / engine.name
    shutil.copy(engine, old)
    text = (engine.parent / (engine.name + ".runtime.txt")).read_text()
    assert text.startswith("wan_trt_runtime 6\n")
    (tmp_path / (engine.name + ".runtime.txt")).write_text(text.replace("wan_trt_runtime 6", f"wan_trt_runtime {version}"))
    inputs = synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9)
    with pytest.raises(WanTrtError, match=f"older wan-trt \\({contract}\\): {re.escape(fix)}"):
        run_wan_stream(wan_stream, old, write_stream_inputs(inputs, tmp_path / "in.pt"), 1, tmp_path / "out.pt")


def test_cpp_runtime_refuses_a_start_block_its_inputs_do_not_hold(aoti, wan_stream, tmp_path):
    export_dir, engine = aoti
    inputs = synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9, first_block=5)
    with pytest.raises(WanTrtError, match="--start-block 0: the inputs hold the stream from block 5"):
        run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 1, tmp_path / "out.pt",
                       start_block=0)


def test_cpp_runtime_runs_to_the_last_reachable_block_and_refuses_the_next(aoti, decoder_aoti, wan_stream, tmp_path):
    """wan_stream asked for 2 blocks from the last one a stream reaches ran that block, then failed at the next:
    the blocks asked are judged before any block runs, naming --blocks, and nothing is written. The session's
    own refusal of the step past the reach is the library's (api_refusals' step-past)."""
    from wan_trt.stream import max_stream_blocks
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    last = max_stream_blocks(cfg) - 1
    inputs = synthetic_stream(cfg, 2, seed=9, first_block=last)
    out = tmp_path / "out.pt"
    with pytest.raises(WanTrtError, match=re.escape(f"error: --blocks: from first_block {last}, 2 blocks: a stream "
                                                    f"reaches 268435456 latent frames (blocks 0 to {last}); ask for "
                                                    f"at most 1 block(s) from block {last}")) as refused:
        run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 2, out)
    assert "block 0:" not in str(refused.value) and not out.exists()
    run = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 1, out)
    assert len(run.block_ms) == 1 and torch.isfinite(run.latents).all()
    assert _api_refusal(wan_stream, "step-past", engine, decoder_aoti) == (
        f"block {last + 1} would end past the 268435456 latent frames a stream can reach: start a new stream")


# ---- with the decoder engine pair, and actions from a file ----------------------------------------

def _copy_pair(decoder_engine, to):
    """The decoder engine pair (engines and their files) copied into ``to``/first and ``to``/steady."""
    import shutil
    for call in ("first", "steady"):
        (to / call).mkdir(parents=True)
        for f in decoder_engine.parents[1].joinpath(call).glob(decoder_engine.name + "*"):
            shutil.copy(f, to / call / f.name)
    return to / "steady" / decoder_engine.name


@pytest.mark.parametrize("pair", ["decoder_aoti", "tiny_decoder_aoti"])
def test_cpp_and_python_stream_the_same_frames(aoti, pair, wan_stream, tmp_path, request):
    """DiT engine + decoder engine pair (the Wan decoder's, the tiny decoder's) over 8 blocks: the C++ runtime
    yields exactly the Python session's uint8 frames (9 + 12 * 7), and times the decode with the other stages."""
    from wan_trt.engines.runtime.decoder import DecoderStream
    decoder_aoti = request.getfixturevalue(pair)
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    inputs = synthetic_stream(manifest.spec.config, BLOCKS, seed=9)
    with AotiRunner(engine, manifest) as runner, DecoderStream.from_engine(decoder_aoti, "aoti", "cpu") as decoder:
        results = stream_blocks(StreamingSession(runner, noise=NoiseSource(4), decoder=decoder), inputs, BLOCKS)
    python = torch.cat([r.frames for r in results])
    first = decoder_aoti.parents[1] / "first" / decoder_aoti.name  # either engine of the pair names it
    run = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), BLOCKS,
                         tmp_path / "out.pt", seed=4, decoder=first)
    assert run.frames.dtype == torch.uint8 and run.frames.shape == (9 + 12 * (BLOCKS - 1), 32, 48, 3)
    assert run.frames.float().std() > 10  # real pictures, not a constant
    assert torch.equal(run.frames, python)
    torch.testing.assert_close(run.latents, torch.cat([r.latents for r in results], dim=2), rtol=0, atol=1e-6)
    assert all(list(s) == ["passes", "clean", "checks", "decode", "commit"] for s in run.stage_ms)


def test_cpp_runtime_refuses_a_decoder_that_is_not_the_streams(aoti, decoder_aoti, wan_stream, tmp_path):
    """A missing other graph, a pair of two decoders, a DiT engine as decoder, and a decoder whose latents
    differ from the DiT's are refused before any block runs, and nothing is written."""
    export_dir, engine = aoti
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9), tmp_path / "in.pt")
    out = tmp_path / "out.pt"

    def refused(decoder, message):
        with pytest.raises(WanTrtError, match=message):
            run_wan_stream(wan_stream, engine, inputs, 1, out, decoder=decoder)
        assert not out.exists()

    lone = _copy_pair(decoder_aoti, tmp_path / "lone")
    (lone.parents[1] / "first" / lone.name).unlink()
    refused(lone, "its other graph's engine .*first/engine_aoti_cpu.pt2 is missing; build both with `wan-trt build")

    def edited(name, call, old, new):
        steady = _copy_pair(decoder_aoti, tmp_path / name)
        text = steady.parents[1] / call / (steady.name + ".runtime.txt")
        assert old in text.read_text()
        text.write_text(resealed(text.read_text().replace(old, new)))
        return steady

    refused(edited("mixed", "first", "config universal-small", "config gta_drive-small"),
            "are not the first and steady graphs of one decoder")
    wider = edited("wider", "first", "input latents float32 1 16 3 4 6", "input latents float32 1 16 3 4 8")
    wider_steady = wider.with_name(wider.name + ".runtime.txt")
    wider_steady.write_text(resealed(wider_steady.read_text().replace("input latents float32 1 16 3 4 6",
                                                                      "input latents float32 1 16 3 4 8")))
    refused(wider, r"takes other latents than the DiT .*export and build the decoder from the same config")
    import shutil
    for call in ("first", "steady"):  # DiT engine files where a decoder's should be
        (tmp_path / "dit" / call).mkdir(parents=True)
        for f in (engine, engine.with_name(engine.name + ".runtime.txt")):
            shutil.copy(f, tmp_path / "dit" / call / f.name)
    dit = tmp_path / "dit" / "steady" / engine.name
    refused(dit, "runtime file of another kind of engine \\(wan_trt_runtime 6\\), not wan_trt_decoder 6")


@pytest.fixture(scope="module")
def overflowing_decoder(aoti, tmp_path_factory):
    """The steady engine of a decoder pair (CPU AOTInductor, built once: ~40 s) of other weights than
    ``decoder_aoti``'s: upstream's key names with a head of 3e38s, finite weights whose frames overflow to
    NaN/Inf."""
    from wan_trt.engines.build import BuildOptions, build_engine
    from wan_trt.export.decoder import export_decoder
    from wan_trt.model import build_decoder
    root = tmp_path_factory.mktemp("overflowing_decoder")
    cfg = Manifest.read(aoti[0]).spec.config
    state = build_decoder(cfg, seed=4).state_dict()
    state["decoder.head.2.weight"] = torch.full_like(state["decoder.head.2.weight"], 3e38)  # finite: loads
    torch.save(state, root / "vae.pth")
    export_decoder(cfg, root / "dec", "fp32", weights=str(root / "vae.pth"), seed=4, onnx=False)
    return build_engine(str(root / "dec"), None, BuildOptions(backend="aoti", precision="fp32", device="cpu"))


def test_cpp_runtime_refuses_a_decoder_pair_of_two_weights_as_python_does(aoti, decoder_aoti, overflowing_decoder,
                                                                          wan_stream, tmp_path):
    """first/ of one decoder export beside steady/ of another, exported from other weights (a copy, or a re-export
    with another checkpoint stopped between its two graphs): Python refused the pair, the C++ runtime streamed it
    (the runtime files recorded no weights). Both refuse it before any block runs, and nothing is written."""
    import shutil

    from wan_trt.engines.runtime.decoder import DecoderStream
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    other = overflowing_decoder
    mixed = _copy_pair(decoder_aoti, tmp_path / "mixed")
    for f in other.parent.glob(other.name + "*"):  # steady/'s engine, metadata and runtime file: the other weights'
        shutil.copy(f, mixed.parent / f.name)
    with pytest.raises(WanTrtError, match="first/ and steady/ were exported from different configs, precisions or "
                                          "weights"):
        DecoderStream.from_engine(mixed, "aoti", "cpu")
    out = tmp_path / "out.pt"
    inputs = write_stream_inputs(synthetic_stream(cfg, 1, seed=9), tmp_path / "in.pt")
    with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): error: decoder engine .*first/.* and .*steady/.* are "
                                          r"exported from different weights \(sha256 \w{12}\.\.\. and \w{12}\.\.\.\); "
                                          r"re-export both with `wan-trt export --graph decoder --overwrite` and build"):
        run_wan_stream(wan_stream, engine, inputs, 1, out, decoder=mixed)
    assert not out.exists()


def test_the_library_refuses_a_decoder_stream_of_two_exports_graphs(aoti, decoder_aoti, overflowing_decoder,
                                                                     wan_stream):
    """The DecoderStream constructor compared the graphs' calls and devices only (config, precision and weights only
    when DecoderEngines::load paired the files): a program pairing the first graph of one decoder export with the
    steady graph of another streamed frames of neither."""
    message = _api_refusal(wan_stream, "mixed-decoder", aoti[1], decoder_aoti, overflowing_decoder)
    assert re.fullmatch(r"DecoderStream: its two graphs' specs are exported from different weights \(sha256 \w{12}"
                        r"\.\.\. and \w{12}\.\.\.\); give it the pair of one decoder export .*", message), message


@pytest.mark.parametrize("version, contract", [(3, "no weights' sha256"), (4, "no device"), (5, "no graph kind")])
def test_cpp_runtime_refuses_a_decoder_runtime_file_of_an_older_contract(decoder_aoti, aoti, wan_stream, tmp_path,
                                                                         version, contract):
    """A decoder runtime file of version 3 records no weights, so its pair cannot be judged, and one of version 4
    no device, so a run on another kind cannot be refused, and one of version 5 no graph kind, so its messages cannot
    name the export command of its decoder: rebuild (it rewrites the file), as for the DiT's older runtime files."""
    export_dir, engine = aoti
    steady = _copy_pair(decoder_aoti, tmp_path / "old")
    runtime = steady.with_name(steady.name + ".runtime.txt")
    assert runtime.read_text().startswith("wan_trt_decoder 6\n")
    runtime.write_text(runtime.read_text().replace("wan_trt_decoder 6", f"wan_trt_decoder {version}"))
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9), tmp_path / "in.pt")
    with pytest.raises(WanTrtError, match=f"error: {re.escape(str(runtime))} is from an older wan-trt "
                                          f"\\({contract}\\): rebuild with `wan-trt build`, which keeps an up-to-date "
                                          "engine"):
        run_wan_stream(wan_stream, engine, inputs, 1, tmp_path / "out.pt", decoder=steady)


def test_cpp_runtime_refuses_a_decoder_built_for_another_kind_of_device(decoder_aoti, aoti, wan_stream, tmp_path):
    """A decoder package built for CUDA run with --device cpu was not refused as Python refuses it: its runtime
    file named no device. Refused naming the decoder and the device it was built for (here a CPU pair whose files
    say cuda, resealed: nothing loads it)."""
    export_dir, engine = aoti
    steady = _copy_pair(decoder_aoti, tmp_path / "pair")
    for call in ("first", "steady"):
        runtime = tmp_path / "pair" / call / (steady.name + ".runtime.txt")
        assert "\ndevice cpu\n" in runtime.read_text()
        runtime.write_text(resealed(runtime.read_text().replace("\ndevice cpu\n", "\ndevice cuda\n")))
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9), tmp_path / "in.pt")
    with pytest.raises(WanTrtError, match=re.escape(f"error: --decoder {steady}: built for cuda, but asked to run on "
                                                    "--device cpu; run it on cuda, or build one for cpu")):
        run_wan_stream(wan_stream, engine, inputs, 1, tmp_path / "out.pt", decoder=steady)
    assert not (tmp_path / "out.pt").exists()


def resealed(text):
    """A runtime file's ``text`` with its sha256 line made anew for its other lines (as a build writes it)."""
    from wan_trt.engines.runtime.runtime_file import sealed
    return sealed("".join(text.splitlines(keepends=True)[:-1]))


def _actions_file(path, lines):
    import json
    path.write_text("\n".join(json.dumps(x) if not isinstance(x, str) else x for x in lines) + "\n")
    return path


def test_cpp_runtime_reads_actions_from_a_json_lines_file_as_python_does(aoti, wan_stream, tmp_path):
    """Held and per-frame actions from the file drive the C++ stream to the latents the Python session
    makes from the same file through wan_trt.actions; they are not the inputs file's actions."""
    import dataclasses

    from wan_trt.actions import read_actions
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    cfg = manifest.spec.config
    keys = cfg.model.action_config.keyboard_dim_in
    lines = ['{"mouse": [0.3, -0.2], "keyboard": [1, 0, 0, 0]}',
             "",  # blank lines are skipped
             {"mouse": [[0.05 * i, -0.01 * i] for i in range(12)], "keyboard": [0] * (keys - 1) + [1]},
             '{"\\u006douse": [0, 0.5], "keyboard": ' + str([[i % 2] * keys for i in range(12)]) + '}']  # \u escape
    path = _actions_file(tmp_path / "actions.jsonl", lines)
    synthetic = synthetic_stream(cfg, 3, seed=9)
    inputs = dataclasses.replace(synthetic, **read_actions(path, cfg, 3))
    with AotiRunner(engine, manifest) as runner:
        python = torch.cat([r.latents for r in stream_blocks(StreamingSession(runner, noise=NoiseSource(4)),
                                                             inputs, 3)], dim=2)
    stored = write_stream_inputs(synthetic, tmp_path / "in.pt")  # the file's actions replace these
    cpp = run_wan_stream(wan_stream, engine, stored, 3, tmp_path / "out.pt", seed=4, actions=path).latents
    torch.testing.assert_close(cpp, python, rtol=0, atol=1e-6)
    without = run_wan_stream(wan_stream, engine, stored, 3, tmp_path / "without.pt", seed=4).latents
    assert (without - cpp).abs().max() > 1e-3


@pytest.mark.parametrize("lines, message", [
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}], r"actions.jsonl: 1 block line\(s\), 2 block\(s\) asked; add lines "
                                                    r"or pass --blocks 1"),
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, "{\"mouse\": [0, 0],"], r"line 2 \(block 1\): not JSON"),
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, {"mouse": [0, 0]}],
     r"line 2 \(block 1\): expected an object with keys \['keyboard', 'mouse'\] \(universal-small\), got \['mouse'\]"),
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, [[0, 0]]], r"line 2 \(block 1\): expected an object .*, got list"),
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, '{"mouse": [9, 9], "keyboard": [0, 0, 0, 0], "mouse": [0, 0]}'],
     r"line 2 \(block 1\): key 'mouse' given twice; give each action once"),  # JSON allows it; which one was meant?
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, '{"\\mouse": [0, 0], "keyboard": [0, 0, 0, 0]}'],
     r"line 2 \(block 1\): not JSON"),  # an invalid escape
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, "[" * 100000], r"line 2 \(block 1\): not JSON"),  # too deep
    ([{"mouse": [[0, 0]] * 8, "keyboard": [0, 0, 0, 0]}, {"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}],
     r"line 1 \(block 0\), mouse: expected 2 finite numbers \(held for the block\) or 9 rows of 2"),
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, {"mouse": [0, 1e39], "keyboard": [0, 0, 0, 0]}],
     r"line 2 \(block 1\), mouse: expected 2 finite numbers .* each within \+-3.40282e\+38 \(the stream's precision\)"),
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, {"mouse": [0, True], "keyboard": [0, 0, 0, 0]}],
     r"line 2 \(block 1\), mouse: expected 2 finite numbers"),
    ([{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}, '{"mouse": [0, ' + "9" * 4400 + '], "keyboard": [0, 0, 0, 0]}'],
     r"line 2 \(block 1\), mouse: expected 2 finite numbers"),  # Python: 'not a JSON line wan-trt reads'
    (['\ufeff{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}', {"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}],
     r"line 1 \(block 0\): not JSON \(it begins with a UTF-8 byte-order mark, which some editors write\); save the "
     r"file as UTF-8 without one"),  # C++ said 'Expecting value at column 1' of a line that looks right
])
def test_cpp_runtime_refuses_the_actions_python_refuses(aoti, wan_stream, tmp_path, lines, message):
    from wan_trt.actions import read_actions
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    assert cfg.model.action_config.keyboard_dim_in == 4 and cfg.has_mouse
    path = _actions_file(tmp_path / "actions.jsonl", lines)
    with pytest.raises(WanTrtError, match=message):
        read_actions(path, cfg, 2)
    out = tmp_path / "out.pt"
    with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): error: --actions .*" + message):
        run_wan_stream(wan_stream, engine, write_stream_inputs(synthetic_stream(cfg, 2, seed=9), tmp_path / "in.pt"),
                       2, out, actions=path)
    assert not out.exists()


def test_cpp_runtime_refuses_by_line_an_action_the_engines_dtype_cannot_hold(aoti_fp16, aoti, wan_stream, tmp_path):
    """fp16 holds up to 65504: 7e4 in line 3 passed the C++ reader (it checked fp32's range), blocks 0 and 1 ran,
    and block 2 was refused as 'NaN or Inf'. Both readers refuse it by line with the engine's limit before any
    block runs; 65504 streams, and an fp32 engine streams 7e4."""
    import re
    import subprocess

    from wan_trt.actions import read_actions
    export_dir, engine = aoti_fp16
    cfg = Manifest.read(export_dir).spec.config
    inputs = write_stream_inputs(synthetic_stream(cfg, 3, seed=9), tmp_path / "in.pt")
    out = tmp_path / "out.pt"

    def actions(value):
        held = {"mouse": [0.1, 0.0], "keyboard": [1, 0, 0, 0]}
        return _actions_file(tmp_path / "actions.jsonl", [held, held, dict(held, mouse=[value, 0.0])])

    message = (r"--actions \S+actions.jsonl, line 3 \(block 2\), mouse: expected 2 finite numbers \(held for the "
               r"block\) or 12 rows of 2 \(one per video frame\), each within \+-65504 \(the stream's precision\)")
    with pytest.raises(WanTrtError, match=message):
        read_actions(actions(70000.0), cfg, 3, torch.float16)
    proc = subprocess.run([str(wan_stream), "--engine", str(engine), "--inputs", str(inputs), "--blocks", "3",
                           "--out", str(out), "--actions", str(actions(70000.0))], capture_output=True, text=True)
    assert proc.returncode == 1 and re.fullmatch("error: " + message, proc.stderr.strip()), (proc.returncode,
                                                                                              proc.stderr)
    assert "block " not in proc.stdout and not out.exists()
    run = run_wan_stream(wan_stream, engine, inputs, 3, out, actions=actions(65504.0))
    assert run.latents.dtype == torch.float16 and len(run.block_ms) == 3 and torch.isfinite(run.latents).all()
    fp32 = run_wan_stream(wan_stream, aoti[1], inputs, 3, tmp_path / "fp32.pt", actions=actions(70000.0))
    assert len(fp32.block_ms) == 3 and torch.isfinite(fp32.latents).all()


FP32_MAX = int(torch.finfo(torch.float32).max)  # 2**128 - 2**104


@pytest.mark.parametrize("number, read", [
    (str(FP32_MAX + 1), True),  # Python compared the integer exactly and refused it; C++ read its double, the max
    (str(FP32_MAX) + ".5", True),
    (str(FP32_MAX + 2**74 - 1), True),  # doubles lie 2**75 apart here: the largest integer read as the max
    (str(FP32_MAX + 2**74 + 1), False),
    ("3.4028235e38", False),  # float32's max to 8 digits: a double above it (float32 would round it to the max)
])
def test_python_and_cpp_hold_a_number_at_the_dtypes_limit_alike(aoti, wan_stream, tmp_path, number, read):
    """A number is read as the double nearest it, which must lie within +-torch.finfo(dtype).max, in both
    readers: the integer float32 max + 1 streamed from C++ (its double is the max) and was refused by Python."""
    from wan_trt.actions import read_actions
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    path = _actions_file(tmp_path / "actions.jsonl", ['{"mouse": [' + number + ', 0], "keyboard": [0, 0, 0, 0]}'])
    inputs = write_stream_inputs(synthetic_stream(cfg, 1, seed=9), tmp_path / "in.pt")
    refused = r"line 1 \(block 0\), mouse: expected 2 finite numbers .* each within \+-3.40282e\+38"
    if read:
        assert read_actions(path, cfg, 1)["mouse"][0, 0, 0] == torch.finfo(torch.float32).max
        with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): error: latents of block 0 came out non-finite"):
            run_wan_stream(wan_stream, engine, inputs, 1, tmp_path / "out.pt", actions=path)  # read, streamed
    else:
        with pytest.raises(WanTrtError, match=refused):
            read_actions(path, cfg, 1)
        with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): error: --actions .*" + refused):
            run_wan_stream(wan_stream, engine, inputs, 1, tmp_path / "out.pt", actions=path)


@pytest.mark.parametrize("flag, value, message", [("--blocks", "8x", "--blocks: expected an integer, got '8x'"),
                                                  ("--blocks", "0", "--blocks: at least 1, got 0"),
                                                  ("--seed", "", "--seed: expected an integer, got ''")])
def test_wan_stream_refuses_bad_numbers_with_a_message(aoti, wan_stream, tmp_path, flag, value, message):
    """A user error exits 1 with a message, not an abort."""
    import subprocess
    export_dir, engine = aoti
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9), tmp_path / "in.pt")
    args = {"--engine": str(engine), "--inputs": str(inputs), "--out": str(tmp_path / "out.pt"), flag: value}
    proc = subprocess.run([str(wan_stream), *[x for kv in args.items() for x in kv]], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: " + message, (proc.returncode, proc.stderr)


def test_cpp_runtime_refuses_a_folder_as_actions_file(aoti, wan_stream, tmp_path):
    from wan_trt.actions import read_actions
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    with pytest.raises(WanTrtError, match="a folder, where a file is read"):
        read_actions(tmp_path, cfg, 1)
    with pytest.raises(WanTrtError, match=r"error: --actions .*: a folder, where a file is read"):
        run_wan_stream(wan_stream, engine, write_stream_inputs(synthetic_stream(cfg, 1, seed=9), tmp_path / "in.pt"),
                       1, tmp_path / "out.pt", actions=tmp_path)


def _wan_stream_args(wan_stream, aoti, tmp_path, blocks=1, **flags):
    export_dir, engine = aoti
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, blocks, seed=9),
                                 tmp_path / "in.pt")
    args = {"--engine": str(engine), "--inputs": str(inputs), "--blocks": "1", "--out": str(tmp_path / "out.pt")}
    args.update({k: v.format(tmp=tmp_path, inputs=inputs, engine=engine) for k, v in flags.items()})
    return [str(wan_stream), *[x for kv in args.items() for x in kv]]


@pytest.mark.parametrize("flags, message", [
    ({"--action": "{tmp}/a.jsonl"}, "unknown flag --action"),  # a typo was dropped: synthetic actions, exit 0
    ({"--out": "{inputs}"}, "--out {inputs} is also --inputs"),  # the inputs were replaced by the latents
    ({"--out": "{engine}"}, "--out {engine} is also --engine"),
    ({"--out": "{tmp}/no/such/out.pt"}, "--out {tmp}/no/such/out.pt: no folder {tmp}/no/such"),  # ran, wrote nothing
    ({"--out": "{tmp}"}, "--out {tmp} is a folder; give a file path"),  # ran, wrote nothing, exit 0
    ({"--device": "gpu"}, "--device gpu: expected cpu, cuda or cuda:N"),  # an 'internal error' with a stack trace
    # libtorch's 'Could not parse device index' (a page of backtrace, exit 2) after the engine's files were read;
    # cuda:300 wrapped round to cuda:44
    ({"--device": "cuda:99999999999"}, "--device cuda:99999999999: expected cuda:N with N from 0 to 127"),
    ({"--device": "cuda:300"}, "--device cuda:300: expected cuda:N with N from 0 to 127"),
    ({"--blocks": "4"}, "--blocks 4: the inputs hold 1 block(s)"),  # ran the blocks it had, then crashed
    ({"--seed": "-1"}, "--seed: 0 to 4294967295, got -1"),
    ({"--seed": "4294967296"}, "--seed: 0 to 4294967295, got 4294967296"),
])
def test_wan_stream_refuses_what_it_cannot_do_before_any_block(aoti, wan_stream, tmp_path, flags, message):
    import subprocess
    cmd = _wan_stream_args(wan_stream, aoti, tmp_path, **flags)
    inputs = (tmp_path / "in.pt").read_bytes()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    expected = "error: " + message.format(tmp=tmp_path, inputs=tmp_path / "in.pt", engine=aoti[1])
    assert proc.returncode == 1 and proc.stderr.strip() == expected, (proc.returncode, proc.stderr)
    assert "block 0" not in proc.stdout and (tmp_path / "in.pt").read_bytes() == inputs
    assert not (tmp_path / "out.pt").exists()


def test_wan_stream_refuses_frames_and_latents_into_one_file(aoti, decoder_aoti, wan_stream, tmp_path):
    """--out X --frames X kept only the frames: the latents were lost, exit 0."""
    import subprocess
    same = str(tmp_path / "same.pt")
    cmd = _wan_stream_args(wan_stream, aoti, tmp_path, **{"--out": same, "--decoder": str(decoder_aoti),
                                                         "--frames": same})
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == f"error: --frames {same} is also --out", proc.stderr
    assert not (tmp_path / "same.pt").exists()


@pytest.mark.parametrize("out, frames, message", [
    ("a.pt", "a.pt.wan_stream", "--frames {tmp}/a.pt.wan_stream is also --out's record"),
    ("b.pt.wan_stream", "b.pt", "--frames {tmp}/b.pt: its record, {tmp}/b.pt.wan_stream, would be --out; give "
                                "another path"),
])
def test_wan_stream_refuses_an_output_where_the_other_outputs_record_goes(aoti, decoder_aoti, wan_stream, tmp_path,
                                                                         out, frames, message):
    """An output named as the other output's record (OUT.wan_stream) passed the checks and met it at the end, after
    every block had run: one of the two was not written."""
    import subprocess
    cmd = _wan_stream_args(wan_stream, aoti, tmp_path, **{"--out": str(tmp_path / out), "--decoder": str(decoder_aoti),
                                                         "--frames": str(tmp_path / frames)})
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: " + message.format(tmp=tmp_path), proc.stderr
    assert "block 0" not in proc.stdout


LINE = '{"mouse": [0, 0], "keyboard": [0, 0, 0, 0]}'


@pytest.mark.parametrize("text, message", [
    (LINE + "\r" + LINE + "\r", r"1 block line\(s\), 2 block\(s\) asked"),  # CR-only line ends: Python read 2
    (LINE + "\n\u00a0\n" + LINE + "\n", r"line 2 \(block 1\): not JSON"),  # NBSP is no JSON whitespace
    (LINE + "\x0c" + LINE + "\n", r"1 block line\(s\), 2 block\(s\) asked"),  # a form feed ends no line
    ("\n \t\r\n", r"no block lines \(an empty or blank file\)"),  # said 'pass --blocks 0', which is refused
])
def test_python_and_cpp_split_an_actions_file_into_the_same_lines(aoti, wan_stream, tmp_path, text, message):
    """Lines end at '\\n' only (a '\\r' before it dropped) and a blank line holds JSON whitespace only, in both
    readers: Python's splitlines() also split at '\\r', '\\x0c', '\\x1c'-'\\x1e', U+2028 and skipped lines of
    Unicode spaces, where C++ read the same file as other lines."""
    from wan_trt.actions import read_actions
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    path = tmp_path / "actions.jsonl"
    path.write_bytes(text.encode())
    with pytest.raises(WanTrtError, match=message):
        read_actions(path, cfg, 2)
    with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): error: --actions .*" + message):
        run_wan_stream(wan_stream, engine, write_stream_inputs(synthetic_stream(cfg, 2, seed=9), tmp_path / "in.pt"),
                       2, tmp_path / "out.pt", actions=path)


def test_a_non_utf8_byte_past_the_lines_read_is_not_read(aoti, tmp_path):
    """Python decoded the whole file first: a bad byte in a line past --blocks refused the file, C++ read it."""
    from wan_trt.actions import read_actions
    cfg = Manifest.read(aoti[0]).spec.config
    path = tmp_path / "actions.jsonl"
    path.write_bytes((LINE + "\n").encode() + b"\xff\xfe\n")
    assert read_actions(path, cfg, 1)["mouse"].shape == (1, 9, 2)
    with pytest.raises(WanTrtError, match=r"line 2 \(block 1\): not UTF-8"):
        read_actions(path, cfg, 2)


def test_inputs_of_another_real_dtype_stream_as_python_streams_them(aoti, wan_stream, tmp_path):
    """float64 actions (finite) crashed wan_stream: its finiteness check ran before the conversion to the
    session's dtype ('internal error', exit 2) where Python converts, then checks."""
    import dataclasses
    export_dir, engine = aoti
    inputs = synthetic_stream(Manifest.read(export_dir).spec.config, 2, seed=9)
    wide = dataclasses.replace(inputs, mouse=inputs.mouse.double(), keyboard=inputs.keyboard.double(),
                               cond_concat=inputs.cond_concat.double())
    base = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 2, tmp_path / "a.pt")
    got = run_wan_stream(wan_stream, engine, write_stream_inputs(wide, tmp_path / "wide.pt"), 2, tmp_path / "b.pt")
    assert torch.equal(got.latents, base.latents)


@pytest.mark.parametrize("field", ["keyboard", "cond_concat", "visual_context"])
def test_complex_inputs_are_refused_by_both_runtimes(aoti, wan_stream, tmp_path, field):
    """step() refused a complex tensor, but stream_blocks and wan_stream converted it first: the imaginary
    part was dropped without a word."""
    import dataclasses
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    inputs = synthetic_stream(manifest.spec.config, 1, seed=9)
    inputs = dataclasses.replace(inputs, **{field: getattr(inputs, field) + 5j})
    with AotiRunner(engine, manifest) as runner, pytest.raises(WanTrtError, match=f"{field}: expected a real tensor"):
        stream_blocks(StreamingSession(runner), inputs, 1)
    with pytest.raises(WanTrtError, match=f"wan_stream failed \\(1\\): error: {field}: expected a real tensor"):
        run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 1, tmp_path / "out.pt")


def test_cpp_runtime_refuses_frames_that_come_out_non_finite(aoti, overflowing_decoder, wan_stream, tmp_path):
    """A decoder whose frames come out NaN/Inf (finite weights that overflow: a head of 3e38s): uint8 would
    turn them into black frames. wan_stream refuses the block naming the frames, exits 1 and writes neither
    latents nor frames."""
    from pathlib import Path
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    decoder = overflowing_decoder
    out = tmp_path / "out.pt"
    inputs = write_stream_inputs(synthetic_stream(cfg, 2, seed=9), tmp_path / "in.pt")
    with pytest.raises(WanTrtError, match=r"wan_stream failed \(1\): error: the decoder's frames \(rgb\) came out "
                                          r"non-finite \(NaN or Inf\); its histories were not carried on"):
        run_wan_stream(wan_stream, engine, inputs, 2, out, decoder=decoder)
    assert not out.exists() and not Path(str(out) + ".frames.pt").exists()


def test_wan_stream_replaces_only_its_own_earlier_outputs(aoti, decoder_aoti, wan_stream, tmp_path):
    """--out and --frames replaced any file: a user's notes, an engine's metadata (which broke that engine), and
    a fixed staging name PATH.partial took over a user's file of that name. Then --overwrite replaced any tensor file
    as torch.save writes, a user's checkpoint among them. An existing output is now refused unless --overwrite is
    given, and then only if it is an output of wan_stream: its record (OUT.wan_stream) gives its size and sha256;
    staging files have fresh names."""
    export_dir, engine = aoti
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 2, seed=9), tmp_path / "in.pt")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    checkpoint = tmp_path / "checkpoint.pt"
    torch.save(torch.arange(6.0), checkpoint)  # a tensor file, not an output of wan_stream
    metadata = engine.with_name(engine.name + ".json")
    for target in (notes, checkpoint, metadata):
        before = target.read_bytes()
        with pytest.raises(WanTrtError, match=f"--out {target} exists; pass --overwrite"):
            run_wan_stream(wan_stream, engine, inputs, 1, target)
        with pytest.raises(WanTrtError, match=f"--out {target} exists and is not an output of wan_stream"):
            run_wan_stream(wan_stream, engine, inputs, 1, target, overwrite=True)
        assert target.read_bytes() == before
    out = tmp_path / "out.pt"
    (tmp_path / "out.pt.partial").write_text("mine too")  # the name the staging file had
    first = run_wan_stream(wan_stream, engine, inputs, 1, out, decoder=decoder_aoti)
    with pytest.raises(WanTrtError, match=f"--out {out} exists; pass --overwrite"):
        run_wan_stream(wan_stream, engine, inputs, 2, out, decoder=decoder_aoti)
    second = run_wan_stream(wan_stream, engine, inputs, 2, out, decoder=decoder_aoti, overwrite=True)
    assert first.latents.shape[2] * 2 == second.latents.shape[2] and second.frames.shape[0] > first.frames.shape[0]
    assert (tmp_path / "out.pt.partial").read_text() == "mine too"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint.pt", "in.pt", "notes.txt", "out.pt", "out.pt.frames.pt", "out.pt.frames.pt.wan_stream",
        "out.pt.partial", "out.pt.wan_stream"]  # each output's record beside it; no staging file left
    dead, alive = 2 ** 22 + 1, os.getpid()  # above the kernel's largest pid, and this process's
    left = [tmp_path / f"{name}.partial-{pid}-AbC123" for name in ("out.pt", "out.pt.wan_stream") for pid in (dead, alive)]
    for f in left:  # staging files of killed runs (the pid gone) and of one still going (this process)
        f.write_text("staged")
    run_wan_stream(wan_stream, engine, inputs, 1, out, decoder=decoder_aoti, overwrite=True)
    assert [f.exists() for f in left] == [False, True, False, True]  # the killed run's go, the live one's stay
    torch.save(torch.load(out), out)  # an output rewritten since (its record no longer matches): a file of the user's
    with pytest.raises(WanTrtError, match=f"--out {out} exists and is not an output of wan_stream"):
        run_wan_stream(wan_stream, engine, inputs, 1, out, decoder=decoder_aoti, overwrite=True)


def test_cpp_runtime_loads_only_the_engine_its_runtime_file_was_written_for(aoti, aoti_fp16, wan_stream, tmp_path):
    """It read only the runtime file beside an engine: a damaged copy of the engine, or another engine put in its
    place, streamed. The runtime file now holds the engine's size and sha256, checked before the engine loads."""
    import shutil
    export_dir, engine = aoti
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9), tmp_path / "in.pt")
    runtime = engine.with_name(engine.name + ".runtime.txt")
    for name, make in (("damaged", lambda to: to.write_bytes(_flipped(engine.read_bytes()))),
                       ("other", lambda to: shutil.copy(aoti_fp16[1], to))):
        (tmp_path / name).mkdir()
        copy = tmp_path / name / engine.name
        make(copy)
        shutil.copy(runtime, tmp_path / name / runtime.name)
        out = tmp_path / name / "out.pt"
        with pytest.raises(WanTrtError, match=f"engine {copy}.*not .*the engine its runtime file was written for"):
            run_wan_stream(wan_stream, copy, inputs, 1, out)
        assert not out.exists()


def _flipped(data: bytes) -> bytes:
    """``data`` with one bit of its middle byte flipped (same size)."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 1]) + data[middle + 1:]


@pytest.fixture(scope="module")
def comma_locale(tmp_path_factory):
    """A locale whose decimal point is a comma (de_DE.UTF-8), compiled into a folder of its own: (LOCPATH, name)."""
    import shutil
    import subprocess
    if shutil.which("localedef") is None:
        pytest.skip("localedef is not installed (glibc's locale compiler): no comma-decimal locale to run under")
    root = tmp_path_factory.mktemp("locales")
    made = subprocess.run(["localedef", "-i", "de_DE", "-f", "UTF-8", str(root / "de_DE.UTF-8")],
                          capture_output=True, text=True)
    if not (root / "de_DE.UTF-8").is_dir():
        pytest.skip(f"localedef could not compile de_DE.UTF-8 ({made.returncode}): {made.stderr.strip()[:200]}")
    return root, "de_DE.UTF-8"


def test_the_runtime_reads_its_files_alike_whatever_locale_the_program_set(aoti, wan_stream, comma_locale, tmp_path):
    """The actions reader parsed numbers with strtod, which follows the process's locale: in a program that set
    a comma-decimal locale, 0.3 read as 0 and the stream ran on other actions than the file's, without a word.
    The runtime file (sigmas, rotary base) is read under the same locale here too."""
    import os
    import subprocess

    from wan_trt.actions import read_actions
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    keys = cfg.model.action_config.keyboard_dim_in
    path = _actions_file(tmp_path / "actions.jsonl", [{"mouse": [0.3, -0.25], "keyboard": [1] + [0] * (keys - 1)},
                                                      {"mouse": [1.5e-3, 2.75], "keyboard": [0.5] * keys},
                                                      # below the doubles' range (0, -0), a subnormal, a long one
                                                      '{"mouse": [1e-400, -0.001e-330], "keyboard": [2.5e-310, '
                                                      + "0." + "0" * 500 + "7e480" + ", 12e-1, -1E+2" + "]}"])
    locpath, name = comma_locale
    out = tmp_path / "actions.pt"
    run = subprocess.run([str(wan_stream.parent / "locale_reads"), name, str(engine), str(path), "3", str(out)],
                         capture_output=True, text=True, env={**os.environ, "LOCPATH": str(locpath)})
    assert run.returncode == 0, run.stdout + run.stderr
    python = read_actions(path, cfg, 3)
    expected = torch.cat([python[name] for name in sorted(python)], dim=2)  # as the driver joins them
    assert keys == 4 and torch.equal(expected[0, -1], torch.tensor([0, 7e-21, 1.2, -100, 0, 0]))  # keyboard, mouse
    torch.testing.assert_close(torch.load(out), expected, rtol=0, atol=0)
    # a refusal names the limit as Python does (3.40282e+38, not 3,40282e+38)
    path = _actions_file(tmp_path / "far.jsonl", [{"mouse": [1e39, 0], "keyboard": [0] * keys}])
    with pytest.raises(WanTrtError) as refused:
        read_actions(path, cfg, 1)
    run = subprocess.run([str(wan_stream.parent / "locale_reads"), name, str(engine), str(path), "1", str(out)],
                         capture_output=True, text=True, env={**os.environ, "LOCPATH": str(locpath)})
    assert run.returncode == 1 and "3.40282e+38" in str(refused.value) and "3.40282e+38" in run.stderr, run.stderr


@pytest.mark.parametrize("case, message", [
    # an engine reads its inputs by address, in the layout it was built for: a strided view ran, with wrong outputs
    ("strided", r"feeds do not match the graph spec: input 'latents' is not contiguous \(pass \.contiguous\(\)\)"),
    ("meta", r"feeds do not match the graph spec: input 'latents' is on meta, not cpu"),  # crashed
    ("missing", r"feeds do not match the graph spec: missing input 'latents'"),  # std::map::at's out_of_range
    # the second session's start reset the histories under the first: both streams' frames went wrong, without a word
    ("shared-decoder", r"this decoder is attached to another session: a decoder carries one stream's histories"),
    # said 'wrong shape', or the shape expected alone: not what was given
    ("visual-shape", re.escape("visual_context: expected shape [1, 5, 32] for the stream starting at block 0 of "
                               "'universal-small', got [1, 1, 32]")),
    ("cond-shape", re.escape("cond_concat: expected shape [1, 20, 3, 4, 6] for block 0 of 'universal-small', got "
                             "[1, 20, 1, 4, 6]")),
    ("mouse-shape", re.escape("mouse: expected shape [1, 9, 2] for block 0 of 'universal-small', got [1, 1, 2]")),
    ("held-shape", re.escape("mouse: expected [1, 2] (one action held for block 0) or [1, 9, 2] (one per video frame), "
                             "got [1, 3]")),
    ("held-sparse", re.escape("mouse: expected a dense tensor with values for block 0, got a Sparse tensor")),
])
def test_the_library_refuses_what_its_runners_and_sessions_cannot_run(aoti, decoder_aoti, wan_stream, case, message):
    """What the Python runners and session refuse (Runner.check_feeds, attach_decoder), the C++ library refuses too,
    for a program that calls it directly (engines/cpp/tests/api_refusals.cpp)."""
    assert re.fullmatch(message + ".*", _api_refusal(wan_stream, case, aoti[1], decoder_aoti))


@pytest.mark.parametrize("case, message", [
    ("cpu-graph", "engine .*: CUDA graphs replay work on a CUDA device, and this runner runs on cpu; pass cuda_graph = "
                  "false"),
    ("visual-int", re.escape("visual_context: expected a floating-point tensor of the stream, got Int")),
    ("cond-bool", re.escape("cond_concat: expected a floating-point tensor for block 0, got Bool")),
    ("cond-sparse", re.escape("cond_concat: expected a dense tensor with values for block 0, got a Sparse tensor")),
])
def test_the_library_refuses_what_the_python_session_refuses(aoti, decoder_aoti, wan_stream, case, message):
    """The Python session refuses integer or boolean image features and conditioning, and meta or sparse tensors
    (checked_tensor), and a CUDA-graph runner off CUDA; the C++ library converted the first without a word, ended in
    libtorch's error on the second, and in a CUDA build captured a CPU package's calls as an empty graph whose every
    replay handed back the first call's outputs."""
    assert re.fullmatch(message + ".*", _api_refusal(wan_stream, case, aoti[1], decoder_aoti)), \
        _api_refusal(wan_stream, case, aoti[1], decoder_aoti)


def test_the_library_takes_an_action_held_for_the_block_as_python_does(aoti, wan_stream):
    """The Python session takes one action [1, D] held for a whole block; the C++ session refused it (a program had to
    repeat it per frame itself). Both forms now stream the same latents (engines/cpp/tests/held_actions.cpp)."""
    import subprocess
    run = subprocess.run([str(wan_stream.parent / "held_actions"), str(aoti[1])], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == "held: same latents", run.stdout + run.stderr[-2000:]


def test_the_library_refuses_a_decoder_engine_outside_a_decoder_exports_folders(aoti, decoder_aoti, wan_stream,
                                                                                tmp_path):
    """DecoderEngines::load took the engines in first/ and steady/ beside any folder the given engine lay in: a
    decoder engine copied to X/other/ decoded with X/first/ and X/steady/ (a pair it was never checked against), where
    Python refuses the folder."""
    import shutil
    root = tmp_path / "x"
    for call in ("first", "steady", "other"):
        (root / call).mkdir(parents=True)
        source = decoder_aoti.parents[1] / ("steady" if call == "other" else call)
        for f in source.glob(decoder_aoti.name + "*"):
            shutil.copy(f, root / call / f.name)
    given = root / "other" / decoder_aoti.name
    assert _api_refusal(wan_stream, "decoder-folder", aoti[1], decoder_aoti, given) == (
        f"decoder engine {given}: {root.resolve() / 'other'} is not first/ or steady/ of a decoder export (`wan-trt "
        "export --graph decoder`), where `wan-trt build DECODER_EXPORT` writes the decoder's two engines, one per graph; "
        "give one of those")


def _api_refusal(wan_stream, case, engine, decoder, *actions):
    """The message with which the library refused ``case`` of engines/cpp/tests/api_refusals.cpp."""
    import subprocess
    run = subprocess.run([str(wan_stream.parent / "api_refusals"), case, str(engine), str(decoder), *map(str, actions)],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("refused: "), run.stdout + run.stderr[-2000:]
    return run.stdout.strip().removeprefix("refused: ")


def _engine_file(to, name, data, runtime_text):
    """An engine file ``name`` holding ``data`` in the new folder ``to``, its runtime file holding ``runtime_text``."""
    to.mkdir()
    (to / name).write_bytes(data)
    (to / (name + ".runtime.txt")).write_text(runtime_text)
    return to / name


def tensorrt_plan_stand_in(engine, to):
    """A stand-in for a TensorRT plan, ``to``/engine.plan: a file that is no zip (a plan is none), beside the runtime
    file of ``engine`` (a CPU package) written for it (its size and sha256, resealed): the C++ runtime verifies it."""
    import hashlib
    plan = b"a stand-in for a TensorRT plan: no zip file"
    text = engine.with_name(engine.name + ".runtime.txt").read_text()
    text, found = re.subn(r"\nengine \d+ [0-9a-f]{64}\n", f"\nengine {len(plan)} {hashlib.sha256(plan).hexdigest()}\n",
                          text)
    assert found == 1
    return _engine_file(to, "engine.plan", plan, resealed(text))


def test_the_library_refuses_an_engine_built_for_another_kind_of_device(aoti, decoder_aoti, wan_stream, tmp_path):
    """Only wan_stream compared the kind of device an engine's runtime file names with the device it was run on: an
    AotiRunner made for the CPU loaded a package whose runtime file says cuda. The runner refuses it, as wan_stream
    did (here a CPU package whose runtime file says cuda, resealed)."""
    text = aoti[1].with_name(aoti[1].name + ".runtime.txt").read_text()
    assert "\ndevice cpu\n" in text
    engine = _engine_file(tmp_path / "cuda", aoti[1].name, aoti[1].read_bytes(),
                          resealed(text.replace("\ndevice cpu\n", "\ndevice cuda\n")))
    assert _api_refusal(wan_stream, "load", engine, decoder_aoti) == (f"engine {engine}: built for cuda, but asked "
                                                                      "to run on cpu; run it on cuda, or build one for "
                                                                      "cpu")


def test_the_library_refuses_a_tensorrt_plan_given_to_the_aoti_runner(aoti, decoder_aoti, wan_stream, tmp_path):
    """A TensorRT plan given to an AotiRunner (a runtime built without TensorRT, or wan_stream without --tensorrt)
    went to AOTInductor's loader, which failed on it with a page of libtorch's error. The runner refuses it before it
    loads, saying what the file is and what to do (here a file that is no zip beside a runtime file written for it)."""
    plan = tensorrt_plan_stand_in(aoti[1], tmp_path / "plan")
    assert _api_refusal(wan_stream, "load", plan, decoder_aoti) == TENSORRT_PLAN.format(plan)


REACH = "a stream reaches 268435456 latent frames (blocks 0 to 89478484)"


@pytest.mark.parametrize("case, message", [
    ("actions-before", f"first_block -1: {REACH}; start at one of them"),
    ("actions-beyond", f"first_block 89478485: {REACH}; start at one of them"),
    ("actions-past", f"first_block 89478484, 2 blocks: {REACH}; ask for at most 1 block(s) from block 89478484"),
    ("actions-none", "first_block 0, 0 blocks: expected 1 block or more"),
])
def test_the_library_reads_actions_only_of_blocks_a_stream_reaches(aoti, decoder_aoti, wan_stream, tmp_path, case,
                                                                   message):
    """read_actions took any first_block and number of blocks (wan_stream checked its inputs' first block itself): a
    block before 0 or past a stream's reach, or no block at all, read without a word. The library checks them in one
    place (check_within_reach), for read_actions, the session's start and wan_stream's inputs."""
    keys = Manifest.read(aoti[0]).spec.config.model.action_config.keyboard_dim_in
    actions = _actions_file(tmp_path / "actions.jsonl", [{"mouse": [0, 0], "keyboard": [0] * keys}] * 2)
    assert _api_refusal(wan_stream, case, aoti[1], decoder_aoti, actions) == f"--actions {actions}: {message}"


TENSORRT_PLAN = ("engine {} is a TensorRT plan, not an AOTInductor package (a zip file): run it with the TensorRT "
                 "runner, in a runtime built with -DWAN_TRT_WITH_TENSORRT=ON (make_tensorrt_runner; wan_stream "
                 "--tensorrt)")


@pytest.mark.parametrize("case, kept", [
    ("runner", "a pass ran on the spec given"),  # its feeds were judged against the caller's new, empty spec
    ("decoder", "two blocks decoded to 21 frames"),  # 'spec has no input 'latents'' when a session attached it
    ("session", "two blocks streamed as the spec given says"),  # streamed with the caller's new sigmas
])
def test_runners_decoders_and_sessions_keep_the_specs_they_were_given(aoti, decoder_aoti, wan_stream, case, kept):
    """AotiRunner, DecoderStream and StreamingSession kept references to the caller's spec objects: a temporary one
    dangled, and a caller that changed or reused its object afterwards changed them under it. They keep copies
    (engines/cpp/tests/spec_copies.cpp)."""
    import subprocess
    run = subprocess.run([str(wan_stream.parent / "spec_copies"), case, str(aoti[1]), str(decoder_aoti)],
                         capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == f"kept: {kept}", run.stdout + run.stderr[-2000:]


def test_cpp_stream_script_runs_a_decoder_engine_by_its_own_backend(aoti, decoder_aoti, wan_stream, tmp_path):
    """scripts/cpp_stream.py ran the decoder under aoti+cudagraph whatever the engine was: a --ops plugins engine
    (refused now under another backend's name) and any engine on the CPU failed. By default it now runs the
    engine's own backend (CUDA graphs of it on a GPU)."""
    import json
    import subprocess
    import sys
    export_dir, engine = aoti
    out = tmp_path / "cpp.json"
    script = Path(__file__).resolve().parents[3] / "scripts" / "cpp_stream.py"
    run = subprocess.run([sys.executable, str(script), str(export_dir), str(engine), str(decoder_aoti), "--blocks", "3",
                          "--device", "cpu", "--backend", "aoti", "--build-dir", str(wan_stream.parent),
                          "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["python_decoder_backend"] == "aoti" and report["latents_max_abs_diff"] == 0.0
    assert report["video_frames"] == 9 + 12 * 2


def test_the_library_refuses_actions_for_a_config_without_action_inputs(aoti, decoder_aoti, wan_stream, tmp_path):
    """read_actions of a spec with no mouse and no keyboard input took a file of '{}' lines (which reach nothing), as
    Python's reader did: both refuse it (here a runtime file with the two action inputs taken out, resealed)."""
    text = aoti[1].with_name(aoti[1].name + ".runtime.txt").read_text()
    edited, found = re.subn(r"input (mouse|keyboard)_window [^\n]*\n", "", text)
    assert found == 2
    engine = tmp_path / "edited" / aoti[1].name
    engine.parent.mkdir()
    engine.with_name(engine.name + ".runtime.txt").write_text(resealed(edited))
    actions = tmp_path / "actions.jsonl"
    actions.write_text("{}\n{}\n")
    message = _api_refusal(wan_stream, "actions-config", engine, decoder_aoti, actions)
    assert message == f"--actions {actions}: the config universal-small has no action inputs (no mouse, no keyboard); " \
                      "drop --actions", message


def test_cpp_runtime_refuses_a_pair_of_two_decoders_graphs_naming_them(aoti, decoder_aoti, tiny_decoder_aoti, wan_stream,
                                                                       tmp_path):
    """The tiny decoder's first engine beside the Wan decoder's steady one was refused for its histories, and the
    message named the export commands of both decoders: the runtime files did not say which decoder a graph is of.
    Refused as two decoders' graphs, by their kinds."""
    import shutil
    export_dir, engine = aoti
    mixed = _copy_pair(decoder_aoti, tmp_path / "mixed")
    for f in tiny_decoder_aoti.parents[1].joinpath("first").glob(tiny_decoder_aoti.name + "*"):
        shutil.copy(f, mixed.parents[1] / "first" / f.name)
    inputs = write_stream_inputs(synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9), tmp_path / "in.pt")
    with pytest.raises(WanTrtError, match="are graphs of two decoders \\('tiny-decoder' and 'decoder'\\); re-export "
                                          "both with `wan-trt export --graph decoder --overwrite`"):
        run_wan_stream(wan_stream, engine, inputs, 1, tmp_path / "out.pt", decoder=mixed)


def test_the_library_refuses_a_spec_of_another_engine_than_its_runner_runs(aoti, decoder_aoti, overflowing_decoder,
                                                                          wan_stream, tmp_path):
    """StreamingSession and DecoderStream took the spec they were given on trust: a program that read one engine's
    runtime file and ran another engine streamed with the wrong schedule, shapes or pair. The runners say which engine
    they run (its runtime file's I/O), and a spec of another is refused (here another engine's runtime file: the
    DiT's edited to another engine hash and resealed; the decoder's, the other pair's)."""
    text = aoti[1].with_name(aoti[1].name + ".runtime.txt").read_text()
    other, found = re.subn(r"\nengine (\d+) [0-9a-f]{64}\n", "\nengine \\1 " + "ab" * 32 + "\n", text)
    assert found == 1
    spec = tmp_path / "other.runtime.txt"
    spec.write_text(resealed(other))
    message = _api_refusal(wan_stream, "session-spec", aoti[1], decoder_aoti, spec)
    assert message.startswith("StreamingSession: its runner runs the engine of sha256 ") and "abababababab" in message
    message = _api_refusal(wan_stream, "decoder-specs", aoti[1], decoder_aoti, overflowing_decoder)
    assert message.startswith("DecoderStream (its first graph): its runner runs the engine of sha256"), message
