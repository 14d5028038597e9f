"""The session's block end as CUDA graphs, over a runner whose buffers keep their addresses: the
output check and the cache commit captured once and replayed give the stream of the op-by-op path,
and the replayed check still refuses a non-finite cache entry without committing it."""
import dataclasses

import pytest
import torch

from wan_trt.config import validate
from wan_trt.config_load import load_config
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.cuda_graph import CudaGraphRunner
from wan_trt.engines.runtime.finite import NonFiniteBlock
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.model import build_model
from wan_trt.spec import PassSpec
from wan_trt.stream import NoiseSource, synthetic_stream

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
BLOCKS = 5  # past every window of these configs: the commit's copies and shifts all replayed


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


# P == F (the whole cache copied), P < F (the block's last frames), P > F (shift, then copy)
@pytest.mark.parametrize("name,local", [("universal-small", None), ("gta_drive-small", None),
                                        ("universal-small", 9)])
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
