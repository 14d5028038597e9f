"""The C++ runtime (engines/cpp, driven by engines/runtime/cpp.py) over the CPU AOTInductor package:
the same latents as the Python session, and the same refusals."""
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
def wan_stream(tmp_path_factory):
    """The C++ runtime's wan_stream executable (built once: ~20 s)."""
    return build_cpp(tmp_path_factory.mktemp("cpp") / "build")


def test_python_and_cpp_runtimes_agree_and_match_the_reference(aoti, wan_stream, tmp_path):
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    inputs = synthetic_stream(manifest.spec.config, BLOCKS, seed=9)
    with AotiRunner(engine, manifest) as runner:
        python = torch.cat([r.latents for r in stream_blocks(StreamingSession(runner, noise=NoiseSource(4)),
                                                             inputs, BLOCKS)], dim=2)
    cpp, block_ms = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), BLOCKS,
                                   tmp_path / "out.pt", seed=4)
    assert len(block_ms) == BLOCKS
    torch.testing.assert_close(cpp, python, rtol=0, atol=1e-6)
    expected = torch.cat(reference_stream(reference_model(manifest, torch.float32, "cpu"), inputs, BLOCKS, 4), dim=2)
    for b in range(BLOCKS):
        f = slice(3 * b, 3 * b + 3)
        stats = error_stats(cpp[:, :, f], expected[:, :, f])
        assert stats.rel_l2 < 1e-3 and stats.non_finite == 0, (b, stats)


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
    cpp, _ = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 4,
                            tmp_path / "out.pt", seed=4, start_block=start_block)
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


def test_cpp_runtime_refuses_a_runtime_file_of_the_rope_offset_contract(aoti, wan_stream, tmp_path):
    """Engines built before the rotary inputs take an int32 rope_offset: re-export and rebuild."""
    import shutil
    export_dir, engine = aoti
    old = tmp_path / engine.name
    shutil.copy(engine, old)
    text = (engine.parent / (engine.name + ".runtime.txt")).read_text().replace("wan_trt_runtime 2", "wan_trt_runtime 1")
    (tmp_path / (engine.name + ".runtime.txt")).write_text(text)
    inputs = synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9)
    with pytest.raises(WanTrtError, match="older wan-trt .*re-export and rebuild"):
        run_wan_stream(wan_stream, old, write_stream_inputs(inputs, tmp_path / "in.pt"), 1, tmp_path / "out.pt")


def test_cpp_runtime_refuses_a_start_block_its_inputs_do_not_hold(aoti, wan_stream, tmp_path):
    export_dir, engine = aoti
    inputs = synthetic_stream(Manifest.read(export_dir).spec.config, 1, seed=9, first_block=5)
    with pytest.raises(WanTrtError, match="--start-block 0: the inputs hold the stream from block 5"):
        run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 1, tmp_path / "out.pt",
                       start_block=0)


def test_cpp_runtime_runs_to_the_last_reachable_block_and_refuses_the_next(aoti, wan_stream, tmp_path):
    from wan_trt.stream import max_stream_blocks
    export_dir, engine = aoti
    cfg = Manifest.read(export_dir).spec.config
    last = max_stream_blocks(cfg) - 1
    inputs = synthetic_stream(cfg, 2, seed=9, first_block=last)
    out = tmp_path / "out.pt"
    with pytest.raises(WanTrtError, match=r"block 89478485 would end past the 268435456 latent frames"):
        run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 2, out)
    cpp, ms = run_wan_stream(wan_stream, engine, write_stream_inputs(inputs, tmp_path / "in.pt"), 1, out)
    assert len(ms) == 1 and torch.isfinite(cpp).all()
