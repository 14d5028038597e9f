"""The accuracy policy is precision-aware: an fp32 graph must match fp32 PyTorch to fp32 rounding."""
import re

import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.session import StreamingSession
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest, reference_model
from wan_trt.export.transformer import export_transformer
from wan_trt.validate.metrics import rel_l2_floor, tolerance
from wan_trt.validate.check import CheckOptions, check_runner


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("policy") / "export"
    export_transformer(load_config("universal-small"), out, "fp32", seed=5, onnx=False)
    return out


def _backend(export_dir, scale_row: float | None):
    """The export's own fp32 model as a backend, with one FFN weight row scaled by ``scale_row``."""
    manifest = Manifest.read(export_dir)
    model = reference_model(manifest, torch.float32, "cpu")
    if scale_row is not None:
        with torch.no_grad():
            model.blocks[1].ffn[0].weight[3] *= scale_row
    return manifest, TorchRunner(model, manifest.spec)


def test_floors_by_precision():
    assert rel_l2_floor("fp32") == 1e-5 and rel_l2_floor("bf16") == 1e-3 and rel_l2_floor("fp8") == 1e-3
    assert tolerance(0.0, "fp32") == 1e-5 and tolerance(0.02, "bf16") == 0.04
    with pytest.raises(ValueError, match="int4"):
        rel_l2_floor("int4")


def test_an_exact_fp32_backend_passes(export_dir):
    manifest, backend = _backend(export_dir, None)
    report = check_runner(export_dir, manifest, backend, CheckOptions(blocks=2, seed=1, save_results=False))
    assert report.ok, report.table()


def test_a_check_computes_fp32_as_fp32_not_tf32(export_dir):
    """PyTorch lets cuDNN's fp32 convolutions round their operands to TF32 by default: on a GPU the check's fp32
    reference (and an fp32 engine under check) ran as far from fp32 as an fp16 model. A check runs with fp32 as
    fp32 (cuDNN convolutions and matmuls, read while its backend runs) and leaves the settings as they were."""
    manifest, backend = _backend(export_dir, None)
    seen = []
    backend.static.register_forward_pre_hook(
        lambda *_: seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)))
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    report = check_runner(export_dir, manifest, backend, CheckOptions(blocks=2, seed=1, save_results=False))
    assert report.ok and seen and set(seen) == {(False, False)}, seen
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == before


def test_one_slightly_wrong_weight_row_fails_an_fp32_check(export_dir):
    """0.5 % off in one of 256 rows of one FFN weight: far below the old 1e-3 floor, far above fp32 rounding."""
    manifest, backend = _backend(export_dir, 1.005)
    report = check_runner(export_dir, manifest, backend, CheckOptions(blocks=2, seed=1, save_results=False))
    flow = next(o for o in report.outputs if o.name == "flow")
    assert 1e-5 < flow.stats.rel_l2 < 1e-3, flow.stats  # what the old floor let through
    assert not report.ok and any("flow" in p for p in report.problems())


def test_the_stream_check_covers_positions_far_into_a_stream(export_dir, monkeypatch):
    """A runtime whose frame counter wraps at 2**16 is exact for hours of video and wrong where the
    wrap falls inside the attention window: the deep stream (across frame 2**17) must catch it. The bug is
    in every session, as a bug of the runtime would be: the yardstick's stream ran through the same session
    code, so it wrapped too and lent the engine twice its error (the check passed)."""
    manifest, backend = _backend(export_dir, None)

    def wrapping_counter(session, start_frame):
        return session.spec.rotary_feeds(start_frame % (1 << 16))

    monkeypatch.setattr(StreamingSession, "_rotary_feeds", wrapping_counter)
    report = check_runner(export_dir, manifest, backend, CheckOptions(blocks=2, seed=1, save_results=False))
    early = [b for b in report.stream if b["block"] < 2]
    deep = [b for b in report.stream if b["block"] >= 2]
    assert [b["start_frame"] for b in deep] == [131064, 131067, 131070, 131073]
    assert all(b["ok"] for b in early) and all(o.ok for o in report.outputs)  # exact before the wrap
    assert [b["ok"] for b in deep] == [True, True, True, False] and not report.ok  # wraps before block 43691
    assert any("stream block 43691" in p for p in report.problems())


def test_a_non_finite_block_is_a_failing_row_not_a_crash(export_dir):
    manifest, backend = _backend(export_dir, None)
    with torch.no_grad():
        backend.static.model.blocks[0].ffn[0].weight[0, 0] = float("nan")
    report = check_runner(export_dir, manifest, backend, CheckOptions(blocks=2, seed=1, save_results=False))
    assert not report.ok and report.stream[0]["non_finite"] and "non-finite" in report.stream[0]["error"]
    assert any(p.startswith("stream block 0: ") for p in report.problems())
    assert "block 0" in report.table()


def test_every_registered_precision_has_a_policy():
    from wan_trt.precisions import PRECISIONS
    from wan_trt.validate.metrics import REL_L2_FLOORS
    assert set(REL_L2_FLOORS) == set(PRECISIONS)


def test_every_precision_has_a_pytorch_precision_of_its_dtype():
    from wan_trt.precisions import ENGINE_ONLY, PRECISIONS, pytorch_precision
    for name in PRECISIONS:
        ours = pytorch_precision(name)
        assert ours not in ENGINE_ONLY and PRECISIONS[ours] == PRECISIONS[name]
    assert pytorch_precision("fp8") == "bf16" and pytorch_precision("fp16") == "fp16"


def test_statistics_against_a_non_finite_side_are_nan_and_never_pass():
    from wan_trt.validate.metrics import error_stats, passes
    reference = torch.ones(8)
    broken = reference.clone()
    broken[3] = float("nan")
    zeros = torch.zeros(8)
    against_broken_reference = error_stats(zeros, broken)
    assert against_broken_reference.reference_non_finite == 1 and against_broken_reference.rel_l2 != 0.0
    assert not passes(against_broken_reference, 10.0)
    broken_yardstick = error_stats(broken, reference)  # its NaN is not a zero that rel-L2 forgives
    assert broken_yardstick.non_finite == 1 and not broken_yardstick.rel_l2 <= 1.0
    assert not passes(error_stats(reference, reference), tolerance(broken_yardstick.rel_l2, "bf16"))
    assert not passes(error_stats(reference, reference), float("inf"))


def test_a_yardstick_that_overflows_gives_no_allowance(export_dir, monkeypatch):
    """The PyTorch model in the graph's precision gives NaN: its error is no yardstick, so even a backend
    whose flow is all zeros passed (rel-L2 1 <= 2 x 1) before; now every output it judges fails."""
    from wan_trt.validate import check as check_module

    manifest, backend = _backend(export_dir, None)
    real_run = TorchRunner.infer

    def infer(self, feeds):
        outputs = real_run(self, feeds)
        if self is broken_yardstick[0]:
            outputs = {n: torch.full_like(t, float("nan")) for n, t in outputs.items()}
        if self is backend:
            outputs = {n: torch.zeros_like(t) for n, t in outputs.items()}
        return outputs

    broken_yardstick = []
    real_check = check_module.check_single_pass

    def check_single_pass(backend_, reference, yardstick, *args):
        broken_yardstick.append(yardstick)
        return real_check(backend_, reference, yardstick, *args)

    monkeypatch.setattr(TorchRunner, "infer", infer)
    monkeypatch.setattr(check_module, "check_single_pass", check_single_pass)
    report = check_runner(export_dir, manifest, backend, CheckOptions(stream=False, save_results=False))
    assert report.outputs and not any(o.ok for o in report.outputs)
    assert any("yardstick" in p and "NaN/Inf" in p for p in report.problems()), report.problems()


def test_an_allowance_never_reaches_what_an_all_zero_output_scores():
    """The allowance grew with the yardstick's error without bound: a yardstick 80 % off fp32 allowed 1.63, and an
    engine writing zeros (rel-L2 1.0) passed."""
    from wan_trt.validate.metrics import MAX_ALLOWED_REL_L2, error_stats, passes
    reference = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    zeros = error_stats(torch.zeros(1000), reference)
    assert zeros.rel_l2 == 1.0 and zeros.cosine == 0.0  # 'cosine 1.000' was reported for an all-zero side
    for yardstick in (0.3, 0.8, 5.0):
        allowed = tolerance(yardstick, "bf16")
        assert allowed <= MAX_ALLOWED_REL_L2 < 1.0 and not passes(zeros, allowed)
    assert tolerance(0.02, "bf16") == 0.04  # the policy below the cap is unchanged
    assert error_stats(torch.zeros(3), torch.zeros(3)).cosine == 1.0  # two zero tensors agree


def test_statistics_refuse_tensors_of_other_shapes_even_of_one_size():
    """The shapes were compared after flattening: an output transposed ([3, 2] against [2, 3]) was compared value
    by value against another layout and could pass."""
    from wan_trt.validate.metrics import error_stats
    x = torch.arange(6.0).reshape(2, 3)
    with pytest.raises(ValueError, match=r"shape mismatch: \(3, 2\) vs \(2, 3\)"):
        error_stats(x.t().contiguous(), x)
    with pytest.raises(ValueError, match="shape mismatch"):
        error_stats(x.reshape(6), x)
    assert error_stats(x, x.clone()).rel_l2 == 0.0


def test_a_failure_line_says_which_test_failed(export_dir):
    """A failure from Polygraphy's comparison (e.g. a shape) was printed as 'rel-L2 3.9e-07 > allowed 1.0e-05,
    Polygraphy mean-error check failed': a false inequality and the wrong check."""
    from wan_trt.validate.check import CheckReport, OutputCheck
    from wan_trt.validate.metrics import error_stats
    same = error_stats(torch.ones(4), torch.ones(4))
    report = CheckReport("aoti", "fp32", outputs=[OutputCheck("flow", same, same, 1e-5, False)])
    (line,) = report.problems()
    assert ">" not in line and "within" in line and "Polygraphy's comparison failed" in line, line


def test_a_yardstick_that_overflows_in_the_stream_is_not_blamed_on_the_engine(export_dir):
    """Both streams ran in one try: when the PyTorch yardstick's came out non-finite, the engine's never ran, yet
    its row said non_finite 1 (and for fp16: 'the fp16 graph overflows, use bf16')."""
    from wan_trt.validate.check import _stream_rows
    manifest, backend = _backend(export_dir, None)
    yardstick = reference_model(manifest, torch.float32, "cpu")
    with torch.no_grad():
        yardstick.head.head.weight.fill_(float("inf"))
    calls = []
    backend_infer = backend.infer
    backend.infer = lambda feeds: calls.append(1) or backend_infer(feeds)
    rows = _stream_rows(backend, reference_model(manifest, torch.float32, "cpu"), yardstick, 2, 1, 0)
    assert calls, "the engine's stream did not run"
    assert [r["block"] for r in rows] == [0, 1] and all(r["non_finite"] == 0 for r in rows)
    assert all(not r["ok"] and "yardstick" in r["error"] and "no allowance" in r["error"] for r in rows)


@pytest.mark.parametrize("blocks, phrase", [(10 ** 11, r"--blocks 100000000000: the stream check holds .* GiB.*"
                                                        r"\(the default is 8\)"),
                                            (0, r"--blocks: expected an int >= 1, got 0")])
def test_a_stream_of_blocks_the_check_cannot_hold_is_refused_before_any_work(export_dir, blocks, phrase):
    """--blocks 100000000000 built the references, then died with a traceback from the allocator (the stream's
    inputs alone were 115 TB); blocks=0 ran the deep blocks only and passed with none of a stream's first."""
    manifest, backend = _backend(export_dir, None)
    before = sorted(export_dir.rglob("*"))
    with pytest.raises(WanTrtError, match=phrase):
        check_runner(export_dir, manifest, backend, CheckOptions(blocks=blocks, save_results=False))
    assert sorted(export_dir.rglob("*")) == before  # refused before it touched anything (an earlier report stays)


def test_a_backend_whose_output_has_another_shape_is_refused_saying_which(export_dir):
    """A backend whose output came back in another shape (the same values transposed) crashed the check with a
    traceback from the statistics ("ValueError: shape mismatch"), or from the stream's scheduler after it: it
    does not compute its spec's graph, so nothing of it can be judged. The check stops, naming the output."""
    manifest, backend = _backend(export_dir, None)
    infer = backend.infer

    def transposed(feeds):
        outputs = infer(feeds)
        return {**outputs, "flow": outputs["flow"].permute(4, 3, 2, 1, 0)}
    backend.infer = transposed
    shape = list(manifest.spec.tensor("flow").shape)
    with pytest.raises(WanTrtError, match=re.escape(f"torch's output flow has shape {shape[::-1]}, its spec's is "
                                                    f"{shape}")):
        check_runner(export_dir, manifest, backend, CheckOptions(blocks=1, save_results=False))
    assert not (export_dir / "check" / "report_torch.json").exists()


def test_a_checkpoint_rewritten_since_its_export_is_not_taken_for_the_fp32_reference(tmp_path):
    """Only the weights in the graph's precision were verified: the exported fp32 checkpoint rewritten as its own
    fp16 rounding (the fp16 model's weights unchanged) gave an fp16 check another fp32 reference, and it passed
    against it, its report giving errors against a model that was not the graph's. The check refuses it."""
    from safetensors.torch import load_file, save_file

    from wan_trt.model import build_model
    from wan_trt.model.checkpoint import save_checkpoint
    cfg = load_config("universal-small")
    checkpoint = save_checkpoint(build_model(cfg, seed=11), tmp_path / "ckpt.safetensors")
    export_transformer(cfg, tmp_path / "export", "fp16", weights=str(checkpoint), onnx=False)
    manifest = Manifest.read(tmp_path / "export")
    backend = TorchRunner(build_model(cfg, torch.float16, weights=checkpoint), manifest.spec)
    save_file({k: v.half().float() for k, v in load_file(checkpoint).items()}, str(checkpoint))
    with pytest.raises(WanTrtError, match=re.escape(f"checkpoint {checkpoint.resolve()} has changed since")):
        check_runner(tmp_path / "export", manifest, backend, CheckOptions(stream=False, save_results=False))
