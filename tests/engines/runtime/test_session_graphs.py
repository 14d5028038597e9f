"""The session's block end as CUDA graphs, over a runner whose buffers keep their addresses: the
output check and the cache commit captured once and replayed give the stream of the op-by-op path,
and the replayed check still refuses a non-finite cache entry without committing it.

On the CPU (every run) the session's side is tested with a capture that records the work without
running it and a replay that runs it, as a CUDA graph's capture launches nothing and its replay runs
the captured kernels over the same buffers; on a GPU with real CUDA graphs."""
import contextlib
import dataclasses

import pytest
import torch

from wan_trt.config import validate
from wan_trt.config_load import load_config
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.cuda_graph import CapturedCall, CudaGraphRunner
from wan_trt.engines.runtime.finite import NonFiniteBlock
from wan_trt.engines.runtime.runner import Runner
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.errors import WanTrtError
from wan_trt.model import build_model
from wan_trt.spec import PassSpec
from wan_trt.stream import NoiseSource, synthetic_stream
from tests.engines.runtime.test_session import _assert_same_state, _persistent, _state

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
BLOCKS = 5  # past every window of these configs: the commit's copies and shifts all replayed
CASES = [("universal-small", None), ("gta_drive-small", None), ("universal-small", 9)]  # P == F, P < F, P > F


class RecordedCall(CapturedCall):
    """A CUDA graph's contract on the CPU: capturing records ``fn`` and runs nothing; a replay runs it."""

    def _capture(self, fn):
        return fn, None

    def replay(self):
        return self.graph()


class FixedBuffers(Runner):
    """A CPU runner with a CUDA-graph runner's buffers: its outputs are the same tensors every call."""
    owns_outputs, swap_inputs, fixed_buffers = True, False, True

    def __init__(self, inner: Runner):
        super().__init__(inner.spec, inner.device)
        self.inner, self.outputs = inner, None

    def infer(self, feeds):
        fresh = self.inner.infer(feeds)
        if self.outputs is None:
            self.outputs = {name: t.clone() for name, t in fresh.items()}
        for name, t in fresh.items():
            self.outputs[name].copy_(t)
        return dict(self.outputs)


def _cpu_session(cfg, model, graphed):
    session = StreamingSession(FixedBuffers(TorchRunner(model, PassSpec.from_config(cfg, "fp32"))),
                               noise=NoiseSource(2))
    session.graph_block_end = graphed
    session._captured = {stage: RecordedCall() for stage in session._captured}
    return session


@pytest.mark.parametrize("name,local", CASES)
def test_the_block_end_prepared_once_gives_the_op_by_op_stream(name, local):
    cfg = _config(name, local)
    model = build_model(cfg, seed=1)
    inputs = synthetic_stream(cfg, BLOCKS, seed=2)
    runs = {}
    for graphed in (True, False):
        session = _cpu_session(cfg, model, graphed)
        latents = [r.latents for r in stream_blocks(session, inputs, BLOCKS)]
        runs[graphed] = latents, _persistent(_state(session)), {k: c.captures for k, c in session._captured.items()}
    assert runs[True][2] == {"checks": 1, "commit": 1} and runs[False][2] == {"checks": 0, "commit": 0}
    for b, (a, e) in enumerate(zip(runs[True][0], runs[False][0])):
        assert torch.equal(a, e), f"block {b}"
    _assert_same_state(runs[True][1], runs[False][1])


@pytest.mark.parametrize("refused_block", [0, 2])  # the block whose graphs are captured, and a replay
def test_a_block_refused_by_the_prepared_check_commits_nothing(refused_block):
    """An Inf in one new cache entry of the clean pass is named, nothing is committed (caches, valid
    frames, block), and the block streamed again equals an unpoisoned stream's."""
    cfg = load_config("gta_drive-small")  # P < F: valid_frames moves at the first commit
    model = build_model(cfg, seed=1)
    inputs = synthetic_stream(cfg, 4, seed=2)
    want = [r.latents for r in stream_blocks(_cpu_session(cfg, model, True), inputs, 4)]
    session = _cpu_session(cfg, model, True)
    session.start(inputs.visual_context)
    infer, passes, calls = session.runner.infer, len(session.schedule.timesteps) + 1, []

    def poisoned(feeds):
        outputs = infer(feeds)
        calls.append(1)
        if len(calls) == passes:  # the refused block's clean pass
            outputs["self_v_cur_01"][0, 5, 1, 2] = float("inf")
        return outputs

    for b in range(4):
        mouse, keyboard = inputs.block_actions(cfg, b)
        cond = inputs.block_cond(cfg, b)
        if b == refused_block:
            session.runner.infer, before = poisoned, _state(session)
            with pytest.raises(NonFiniteBlock, match=f"self_v_cur_01 of block {b}.*not committed"):
                session.step(cond, mouse, keyboard)
            session.runner.infer = infer
            _assert_same_state(_persistent(before), _persistent(_state(session)))
        assert torch.equal(session.step(cond, mouse, keyboard).latents, want[b]), b
    assert session._captured["commit"].captures == 1


def _config(name, local):
    cfg = load_config(name)
    if local is not None:
        cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, local_attn_size=local))
        validate(cfg)
    return cfg


def _stream(cfg, model, inputs, graphed):
    with CudaGraphRunner(TorchRunner(model, PassSpec.from_config(cfg, "fp32"))) as runner:
        session = StreamingSession(runner, noise=NoiseSource(2))
        session.graph_block_end = graphed
        latents = [r.latents.clone() for r in stream_blocks(session, inputs, BLOCKS)]
        caches = {name: t.clone() for name, t in session.feeds.items() if "_prev_" in name}
        return latents, caches, {stage: c.captures for stage, c in session._captured.items()}


@CUDA
@pytest.mark.parametrize("name,local", CASES)
def test_graphed_block_end_equals_op_by_op(name, local):
    cfg = _config(name, local)
    model = build_model(cfg, seed=1).cuda()
    inputs = synthetic_stream(cfg, BLOCKS, seed=2)
    latents, caches, captures = _stream(cfg, model, inputs, graphed=True)
    latents_eager, caches_eager, captures_eager = _stream(cfg, model, inputs, graphed=False)
    assert captures == {"checks": 1, "commit": 1} and captures_eager == {"checks": 0, "commit": 0}
    assert caches.keys() == caches_eager.keys() and caches
    for b, (a, e) in enumerate(zip(latents, latents_eager)):
        assert torch.equal(a, e), f"block {b}"
    for k in caches:
        assert torch.equal(caches[k], caches_eager[k]), k


@CUDA
def test_the_replayed_check_refuses_a_non_finite_entry_uncommitted():
    """After the graphs were captured, an Inf in one new cache entry of a block (written into the runner's
    output after its clean pass) is found by the replayed check, named, and nothing is committed."""
    cfg = load_config("universal-small")
    model = build_model(cfg, seed=1).cuda()
    inputs = synthetic_stream(cfg, 4, seed=2)
    with CudaGraphRunner(TorchRunner(model, PassSpec.from_config(cfg, "fp32"))) as runner:
        session = StreamingSession(runner, noise=NoiseSource(2))
        stream_blocks(session, inputs, 2)  # captured at block 0, replayed at block 1
        infer, passes, calls = runner.infer, len(session.schedule.timesteps) + 1, []

        def poisoned(feeds):
            outputs = infer(feeds)
            calls.append(1)
            if len(calls) == passes:  # the clean pass
                outputs["self_v_cur_01"][0, 5, 1, 2] = float("inf")
            return outputs

        runner.infer = poisoned
        before = {k: v.clone() for k, v in session.feeds.items() if "_prev_" in k}
        mouse, keyboard = inputs.block_actions(cfg, 2)
        with pytest.raises(NonFiniteBlock, match="self_v_cur_01 of block 2.*not committed") as exc:
            session.step(inputs.block_cond(cfg, 2), mouse, keyboard)
        assert exc.value.tensor == "self_v_cur_01" and session.block == 2
        assert session._captured["checks"].captures == 1 and session._captured["commit"].captures == 1
        for k, v in before.items():
            assert torch.equal(session.feeds[k], v), k


@CUDA
def test_a_capture_that_failed_is_tried_again_not_replayed_empty():
    """The graph was kept before its capture succeeded: after one failed capture (an OOM) every later call
    replayed an empty graph and returned no outputs (KeyError 'flow' at every step)."""
    cfg = load_config("universal-small")
    model = build_model(cfg, seed=1).cuda()
    inputs = synthetic_stream(cfg, BLOCKS, seed=2)
    with CudaGraphRunner(TorchRunner(model, PassSpec.from_config(cfg, "fp32"))) as runner:
        infer, calls = runner.inner.infer, []

        def out_of_memory_at_capture(feeds):
            calls.append(1)
            if len(calls) == runner.warmup + 1:  # the capture's call
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return infer(feeds)

        runner.inner.infer = out_of_memory_at_capture
        session = StreamingSession(runner, noise=NoiseSource(2))
        with pytest.raises(torch.cuda.OutOfMemoryError):
            stream_blocks(session, inputs, 1)
        latents = [r.latents.clone() for r in stream_blocks(session, inputs, 2)]
    expected, _, _ = _stream(cfg, model, inputs, graphed=True)
    assert len(latents) == 2 and all(torch.equal(a, e) for a, e in zip(latents, expected[:2]))


@pytest.mark.parametrize("name", ["cond_concat", "mouse", "keyboard"])
def test_the_replayed_check_names_a_non_finite_input(name):
    """The inputs' finiteness is read with the outputs' (the replayed check's one sync): a NaN in an input
    is named as that input, not as the latents it spoiled, and nothing outliving the step changed."""
    cfg = load_config("universal-small")
    model = build_model(cfg, seed=1)
    inputs = synthetic_stream(cfg, 4, seed=2)
    session = _cpu_session(cfg, model, graphed=True)
    stream_blocks(session, inputs, 2)
    mouse, keyboard = inputs.block_actions(cfg, 2)
    given = {"cond_concat": inputs.block_cond(cfg, 2), "mouse": mouse, "keyboard": keyboard}
    given[name] = given[name].clone()
    given[name].view(-1)[3] = float("nan")
    before = _state(session)
    with pytest.raises(WanTrtError, match=f"{name} of block 2 holds non-finite values"):
        session.step(given["cond_concat"], given["mouse"], given["keyboard"])
    _assert_same_state(_persistent(before), _persistent(_state(session)))


@contextlib.contextmanager
def _graphed_session_after_two_blocks():
    """A universal-small session over a CUDA-graph runner (fp32 PyTorch model) that has streamed two blocks
    (its graphs captured), and block 2's inputs on the host: (session, cond, mouse, keyboard)."""
    cfg = load_config("universal-small")
    model = build_model(cfg, seed=1).cuda()
    inputs = synthetic_stream(cfg, 4, seed=2)
    with CudaGraphRunner(TorchRunner(model, PassSpec.from_config(cfg, "fp32"))) as runner:
        session = StreamingSession(runner, noise=NoiseSource(2))
        stream_blocks(session, inputs, 2)
        yield (session, inputs.block_cond(cfg, 2), *inputs.block_actions(cfg, 2))


@CUDA
def test_a_step_queues_its_passes_without_waiting_for_the_device():
    """Up to its check, a step over CUDA graphs waits for nothing: the inputs' finiteness is read with the
    outputs' and the rotary tables go through pinned memory (a pageable copy and a .tolist() each held the
    host while the device sat idle), the next block's made during this one. Under CUDA's sync debug mode a
    wait is an error."""
    with _graphed_session_after_two_blocks() as (session, cond, mouse, keyboard):
        cond, mouse, keyboard = (t.cuda() for t in (cond, mouse, keyboard))
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            block = session._validate_block_inputs(cond, mouse, keyboard)
            session._feed(block)
            x0, _ = session._denoise(False)
            session._run(x0, session.schedule.clean_timestep, [])
            session._stage_next_block()  # block 3's tables and first noise
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        frames = session.cfg.block_frames
        assert session._rotary_start == 3 * frames and session._next_noise[0] == 3


@CUDA
def test_with_cuda_graphs_a_non_finite_input_is_named_at_the_check():
    """On the GPU path (CUDA-graph runner, the replayed check): a NaN in an input is found with the outputs'
    reduction and named as that input, and nothing outliving the step changed."""
    with _graphed_session_after_two_blocks() as (session, cond, mouse, keyboard):
        cond = cond.clone()
        cond.view(-1)[7] = float("nan")
        before = _state(session)
        with pytest.raises(WanTrtError, match="cond_concat of block 2 holds non-finite values"):
            session.step(cond.cuda(), mouse.cuda(), keyboard.cuda())
        _assert_same_state(_persistent(before), _persistent(_state(session)))
