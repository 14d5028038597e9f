"""The static-cache runtime against the upstream-semantics pipeline, and the session's contract."""
import concurrent.futures
import multiprocessing

import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.engines.runtime.finite import NonFiniteBlock
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.errors import WanTrtError
from wan_trt.model import build_model
from wan_trt.pipeline import ReferencePipeline
from wan_trt.rotary import MAX_STREAM_FRAMES
from wan_trt.spec import PassSpec
from wan_trt.stream import NoiseSource, max_stream_blocks, synthetic_stream
from wan_trt.validate.stream import compare_stream, reference_stream

BLOCKS = 9  # 27 latent frames: far past every window (eviction included)


def test_static_stream_equals_upstream_semantics(small_cfg, small_model):
    report = compare_stream(small_model, TorchRunner(small_model, PassSpec.from_config(small_cfg, "fp32")),
                            BLOCKS, seed=4)
    assert len(report.blocks) == BLOCKS
    for i, stats in enumerate(report.blocks):
        assert stats.non_finite == 0
        assert stats.max_abs < 2e-5 and stats.rel_l2 < 1e-5, f"block {i}: {stats}"


def _session_errors(cfg, model, patch):
    inputs = synthetic_stream(cfg, BLOCKS, seed=4)
    expected = reference_stream(model, inputs, BLOCKS, seed=4)
    session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")), noise=NoiseSource(4))
    session.start(inputs.visual_context)
    patch(session)
    errors = []
    for b in range(BLOCKS):
        mouse, keyboard = inputs.block_actions(cfg, b)
        got = session.step(inputs.block_cond(cfg, b), mouse, keyboard).latents
        errors.append(float((got - expected[b]).abs().max()))
    return max(errors)


def _no_commit(session):
    session._commit = lambda outputs: None


def _all_valid(session):
    session.valid_frames = session.cfg.prev_frames


def _rope_from_zero(session):
    session._rotary_feeds = lambda start: session.spec.rotary_feeds(0)  # every block at frame 0


@pytest.mark.parametrize("patch", [_no_commit, _all_valid, _rope_from_zero])
def test_the_comparison_catches_cache_bugs(small_cfg, small_model, patch):
    """Each mistake a static runtime could make shows up far above the 2e-5 tolerance."""
    assert _session_errors(small_cfg, small_model, patch) > 1e-2


def test_commit_swaps_or_copies_without_reallocation():
    for name, swap in (("universal-small", True), ("gta_drive-small", False)):
        cfg = load_config(name)
        model = build_model(cfg)
        session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")))
        inputs = synthetic_stream(cfg, 2)
        session.start(inputs.visual_context)
        before = session.feeds["self_k_prev_00"].data_ptr()
        mouse, keyboard = inputs.block_actions(cfg, 0)
        session.step(inputs.block_cond(cfg, 0), mouse, keyboard)
        after = session.feeds["self_k_prev_00"].data_ptr()
        assert (after != before) if swap else (after == before)
        assert session.valid_frames == cfg.prev_frames


def _started(name):
    cfg = load_config(name)
    session = StreamingSession(TorchRunner(build_model(cfg), PassSpec.from_config(cfg, "fp32")))
    inputs = synthetic_stream(cfg, 2)
    session.start(inputs.visual_context)
    return cfg, session, inputs


def test_bad_actions_are_clear_errors():
    cfg, session, inputs = _started("universal-small")
    cond = inputs.block_cond(cfg, 0)
    mouse, keyboard = inputs.block_actions(cfg, 0)
    with pytest.raises(WanTrtError, match=r"mouse: expected shape \[1, 9, 2\]"):
        session.step(cond, mouse[:, :5], keyboard)
    with pytest.raises(WanTrtError, match="needs keyboard actions"):
        session.step(cond, mouse, None)
    with pytest.raises(WanTrtError, match="cond_concat: expected shape"):
        session.step(cond[:, :, :2], mouse, keyboard)
    cfg, session, inputs = _started("templerun-small")
    with pytest.raises(WanTrtError, match="has no mouse input"):
        session.step(inputs.block_cond(cfg, 0), torch.zeros(1, 9, 2), inputs.block_actions(cfg, 0)[1])


def test_one_held_action_per_block():
    cfg, session, inputs = _started("universal-small")
    result = session.step(inputs.block_cond(cfg, 0), torch.tensor([[0.1, 0.0]]), torch.tensor([[1.0, 0, 0, 0]]))
    assert torch.isfinite(result.latents).all() and result.pass_seconds == []  # passes untimed by default
    timed = session.step(inputs.block_cond(cfg, 1), torch.tensor([[0.1, 0.0]]), torch.tensor([[1.0, 0, 0, 0]]),
                         time_passes=True)
    assert len(timed.pass_seconds) == cfg.passes_per_block and all(s > 0 for s in timed.pass_seconds)


def _recorded(session):
    """Record the session's rotary-table loads (their start frames) and noise draws ((block, step))."""
    loads, draws = [], []
    load, noise = session.rotary.load, session.noise
    session.rotary.load = lambda values: loads.append(values) or load(values)
    session.noise = lambda block, step, *args: draws.append((block, step)) or noise(block, step, *args)
    return loads, draws


def test_the_next_blocks_tables_and_first_noise_are_made_during_the_step_before():
    """A step leaves the next block's rotary tables loaded and its first noise drawn (made while the device
    runs the clean pass), so the next step's start loads and draws nothing of its own; a stream's first step
    loads its own tables."""
    cfg, session, inputs = _started("universal-small")
    loads, draws = _recorded(session)
    for b in range(2):
        session.step(inputs.block_cond(cfg, b), *inputs.block_actions(cfg, b))
    steps = len(session.schedule.timesteps)
    assert draws == [(0, 0)] + [d for b in range(2) for d in [(b, i) for i in range(1, steps)] + [(b + 1, 0)]]
    starts = [b * cfg.block_frames for b in range(3)]  # block 0 by its own step, 1 and 2 by the step before
    assert len(loads) == 3 and session._rotary_start == starts[-1]
    for values, start in zip(loads, starts):
        expected = session.spec.rotary_feeds(start)
        assert values.keys() == expected.keys() and all(torch.equal(values[k], expected[k]) for k in values)


def test_a_stream_runs_to_the_last_frame_it_can_reach_and_no_further():
    """The only length limit: MAX_STREAM_FRAMES (where float64 angles stop being exact to fp32). The last
    block stages nothing for a block after it."""
    cfg = load_config("universal-small")
    session = StreamingSession(TorchRunner(build_model(cfg), PassSpec.from_config(cfg, "fp32")))
    last = max_stream_blocks(cfg) - 1
    inputs = synthetic_stream(cfg, 2, first_block=last)
    session.start(inputs.visual_context, start_block=last)
    loads, draws = _recorded(session)
    mouse, keyboard = inputs.block_actions(cfg, last)
    result = session.step(inputs.block_cond(cfg, last), mouse, keyboard)
    assert result.start_frame == last * cfg.block_frames and torch.isfinite(result.latents).all()
    assert len(loads) == 1 and all(block == last for block, _ in draws)
    with pytest.raises(WanTrtError, match=f"past the {MAX_STREAM_FRAMES} latent frames a stream can reach"):
        session.step(inputs.block_cond(cfg, last), mouse, keyboard)


def test_bf16_stream_stays_close_to_fp32(small_cfg):
    fp32 = build_model(small_cfg, torch.float32, seed=2)
    bf16 = build_model(small_cfg, torch.bfloat16, seed=2)
    inputs = synthetic_stream(small_cfg, 4, seed=1)
    ref = reference_stream(fp32, inputs, 4, seed=1)
    session = StreamingSession(TorchRunner(bf16, PassSpec.from_config(small_cfg, "bf16")), noise=NoiseSource(1))
    got = [r.latents for r in stream_blocks(session, inputs, 4)]
    for g, r in zip(got, ref):
        rel = float((g.float() - r).norm() / r.norm())
        assert torch.isfinite(g).all() and rel < 0.05, rel


@pytest.mark.parametrize("local", [3, 5, 9])  # P = 0 (no cache inputs), P < F (slice copy), P > F (roll)
def test_other_window_sizes(local):
    import dataclasses
    from wan_trt.config import validate
    base = load_config("universal-small")
    cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, local_attn_size=local))
    validate(cfg)
    model = build_model(cfg, seed=1)
    spec = PassSpec.from_config(cfg, "fp32")
    assert ("self_k_prev_00" in spec.input_names) == (local > 3)
    report = compare_stream(model, TorchRunner(model, spec), 6, seed=2)
    assert max(s.rel_l2 for s in report.blocks) < 1e-5


# ---- an atomic, honest session -------------------------------------------------------------------

def _state(session):
    """Everything a step may change: block counter, valid frames, every feed, the action histories."""
    return {"block": session.block, "valid_frames": session.valid_frames,
            "feeds": {k: v.clone() for k, v in session.feeds.items()},
            "histories": {k: (h.base, None if h.frames is None else h.frames.clone())
                          for k, h in session.histories.items()}}


def _assert_same_state(a, b, equal_nan=False):
    """``equal_nan``: a NaN a refused step left in a per-block feed equals itself."""
    assert (a["block"], a["valid_frames"]) == (b["block"], b["valid_frames"])
    assert a["feeds"].keys() == b["feeds"].keys()
    for k in a["feeds"]:  # bit for bit
        torch.testing.assert_close(a["feeds"][k], b["feeds"][k], rtol=0, atol=0, equal_nan=equal_nan, msg=k)
    assert a["histories"].keys() == b["histories"].keys()
    for k, (base, frames) in a["histories"].items():
        other = b["histories"][k][1]
        same = other is None if frames is None else other is not None and torch.equal(frames, other)
        assert base == b["histories"][k][0] and same, k  # frames: None before a stream's first block


@pytest.fixture(scope="module")
def universal_small():
    cfg = load_config("universal-small")
    return cfg, build_model(cfg, seed=3), synthetic_stream(cfg, 4, seed=5)


def _session(cfg, model, inputs):
    session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")), noise=NoiseSource(5))
    session.start(inputs.visual_context)
    return session


def _bad_steps(cfg, inputs, block):
    """(inputs of a step that must be refused, what the message must say) for ``block``."""
    cond = inputs.block_cond(cfg, block)
    mouse, keyboard = inputs.block_actions(cfg, block)
    nan_cond, inf_mouse, nan_keyboard = cond.clone(), mouse.clone(), keyboard.clone()
    nan_cond[0, 5, 1, 2, 3] = float("nan")
    inf_mouse[0, -1, 0] = float("inf")
    nan_keyboard[0, 0, 1] = float("nan")
    return [((cond, mouse, keyboard[:, :3]), r"keyboard: expected shape \[1, 12, 4\]"),  # after a good mouse
            ((cond, mouse, None), "needs keyboard actions"),
            ((cond[:, :, :2], mouse, keyboard), "cond_concat: expected shape"),
            ((nan_cond, mouse, keyboard), f"cond_concat of block {block}.*non-finite"),
            ((cond, inf_mouse, keyboard), f"mouse of block {block}.*non-finite"),
            ((cond, mouse, nan_keyboard), f"keyboard of block {block}.*non-finite"),
            ((cond, mouse, keyboard.to(torch.complex64)), "keyboard: expected a real tensor"),
            ((cond, mouse.tolist(), keyboard), "mouse: expected a torch.Tensor")]


def test_a_rejected_step_leaves_the_session_exactly_as_before(universal_small):
    """Session B gets every kind of bad step before block 1, then the same good inputs as A: same latents.
    A step refused for its inputs' shape or type changed nothing; one refused for NaN/Inf in its inputs
    (read with its outputs, after its passes) left only its per-block feeds, which every step rewrites."""
    cfg, model, inputs = universal_small
    a, b = _session(cfg, model, inputs), _session(cfg, model, inputs)
    for block in range(3):
        if block == 1:
            for args, message in _bad_steps(cfg, inputs, block):
                before = _state(b)
                with pytest.raises(WanTrtError, match=message):
                    b.step(*args)
                if "non-finite" in message:
                    _assert_same_state(_persistent(before), _persistent(_state(b)))
                else:
                    _assert_same_state(before, _state(b), equal_nan=True)  # after a finiteness refusal
            _assert_same_state(_persistent(_state(a)), _persistent(_state(b)))
        mouse, keyboard = inputs.block_actions(cfg, block)
        got_a = a.step(inputs.block_cond(cfg, block), mouse, keyboard).latents
        got_b = b.step(inputs.block_cond(cfg, block), mouse, keyboard).latents
        assert torch.equal(got_a, got_b), block
    _assert_same_state(_state(a), _state(b))


def test_start_block_out_of_range_is_refused(universal_small):
    cfg, model, inputs = universal_small
    session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")))
    last = max_stream_blocks(cfg) - 1
    with pytest.raises(WanTrtError, match=f"a stream reaches {MAX_STREAM_FRAMES} latent frames .*start at "
                                          f"block {last} or earlier"):
        session.start(inputs.visual_context, start_block=last + 1)
    with pytest.raises(WanTrtError, match="start_block: expected an int >= 0, got -1"):
        session.start(inputs.visual_context, start_block=-1)
    assert not session.started


def test_step_before_start_is_an_error(universal_small):
    cfg, model, inputs = universal_small
    session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")))
    mouse, keyboard = inputs.block_actions(cfg, 0)
    with pytest.raises(WanTrtError, match=r"step\(\) before start\(\)"):
        session.step(inputs.block_cond(cfg, 0), mouse, keyboard)


def test_non_finite_visual_context_is_refused(universal_small):
    cfg, model, inputs = universal_small
    session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")))
    bad = inputs.visual_context.clone()
    bad[0, 3, 7] = float("-inf")
    with pytest.raises(WanTrtError, match="visual_context of the stream holds non-finite values"):
        session.start(bad)
    assert not session.runner.is_active and not session.feeds["visual_context"].any()


def _persistent(state):
    """The part of a session's state that outlives a step: caches, visual context, counters, histories."""
    feeds = {k: v for k, v in state["feeds"].items() if "_prev_" in k or k == "visual_context"}
    assert any("_prev_" in k for k in feeds)  # the caches are part of it
    return {**state, "feeds": feeds}


def test_a_non_finite_block_is_not_committed(universal_small):
    """NaN weights give NaN latents: the block is refused, nothing is committed, the stream goes on."""
    cfg, model, inputs = universal_small
    a, b = _session(cfg, model, inputs), _session(cfg, model, inputs)
    bias = model.head.head.bias
    for block in range(3):
        mouse, keyboard = inputs.block_actions(cfg, block)
        cond = inputs.block_cond(cfg, block)
        if block == 1:
            before, kept = _state(b), bias.detach().clone()
            with torch.no_grad():
                bias[0] = float("nan")
            try:
                refused = "latents of block 1 came out non-finite.*not committed"
                with pytest.raises(NonFiniteBlock, match=refused) as exc:
                    b.step(cond, mouse, keyboard)
                assert (exc.value.block, exc.value.tensor) == (1, "latents")
            finally:
                with torch.no_grad():
                    bias.copy_(kept)
            _assert_same_state(_persistent(before), _persistent(_state(b)))
        assert torch.equal(a.step(cond, mouse, keyboard).latents, b.step(cond, mouse, keyboard).latents), block


@pytest.mark.parametrize("start_block", [339, 2498])
def test_a_stream_across_upstreams_table_ends_equals_the_reference(start_block):
    """Started just before an end of upstream's RoPE tables (frame 1024 of the main attention's,
    7500 of the actions') with empty caches, four blocks across it: static session == reference
    with its tables extended. Actions change every raw frame, so misplaced padding would show."""
    import dataclasses
    cfg = load_config("universal-small")
    model = build_model(cfg, seed=1)
    inputs = synthetic_stream(cfg, 4, seed=4, first_block=start_block)
    gen = torch.Generator().manual_seed(0)
    inputs = dataclasses.replace(inputs, mouse=torch.randn(inputs.mouse.shape, generator=gen),
                                 keyboard=torch.randn(inputs.keyboard.shape, generator=gen))
    report = compare_stream(model, TorchRunner(model, PassSpec.from_config(cfg, "fp32")), 4, seed=4,
                            inputs=inputs, start_block=start_block)
    assert len(report.blocks) == 4
    for i, stats in enumerate(report.blocks):
        assert stats.non_finite == 0 and stats.max_abs < 2e-5 and stats.rel_l2 < 1e-5, f"block {start_block + i}: {stats}"


LONG_BLOCKS = 2600  # 7800 latent frames: past both of upstream's tables (1024 and 7500 frames)
SAMPLED = [*range(340, 346), *range(1000, 1004), *range(2498, 2504), *range(2595, 2600)]


def _reference_latents(blocks: int, kept: set[int]) -> dict[int, torch.Tensor]:
    """The reference pipeline's latents of the blocks ``kept`` of the long stream (one thread: it runs
    in a process of its own beside the session)."""
    torch.set_num_threads(1)
    cfg = load_config("universal-small")
    inputs = synthetic_stream(cfg, blocks, seed=4)
    stream = ReferencePipeline(build_model(cfg, seed=1)).run(inputs, blocks, NoiseSource(4))
    return {block: latents for block, latents in enumerate(stream) if block in kept}


# 160 s on 2 cores: the default run covers both table ends with streams started before them (above) and
# a continuous 400-block stream (tests/engines/test_stream.py)
@pytest.mark.slow
def test_one_stream_of_2600_blocks_equals_the_reference_without_growth():
    """One stream from block 0 to 7800 latent frames, the static session against the reference with
    its tables extended: sampled blocks around both table ends and at the end agree within fp32
    rounding, and the error does not grow with the position. The reference runs in a second process
    beside the session (about 110-160 s on 2 cores; twice that in one)."""
    kept = {*SAMPLED, *range(8)}
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        reference = pool.submit(_reference_latents, LONG_BLOCKS, kept)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            cfg = load_config("universal-small")
            inputs = synthetic_stream(cfg, LONG_BLOCKS, seed=4)
            session = StreamingSession(TorchRunner(build_model(cfg, seed=1), PassSpec.from_config(cfg, "fp32")),
                                       noise=NoiseSource(4))
            results = stream_blocks(session, inputs, LONG_BLOCKS)
        finally:
            torch.set_num_threads(threads)
        expected = reference.result()
    assert sorted(expected) == sorted(kept)
    errors = {b: float((results[b].latents - e).abs().max()) for b, e in expected.items()}
    assert all(torch.isfinite(r.latents).all() for r in results)
    assert max(errors.values()) < 2e-5, errors
    early, late = max(errors[b] for b in range(8)), max(errors[b] for b in SAMPLED if b >= 2595)
    assert late < max(4 * early, 2e-6), (early, late)


def test_per_frame_actions_without_their_batch_dim_are_named_as_given():
    """A 2-D action was taken for a held one and expanded before its shape was checked: [9, 2] was reported as
    [9, 9, 2]."""
    cfg, session, inputs = _started("universal-small")
    mouse, keyboard = inputs.block_actions(cfg, 0)
    with pytest.raises(WanTrtError, match=r"mouse: expected \[1, 2\] \(one action held for block 0\) or \[1, 9, 2\] "
                                          r"\(one per video frame\), got \[9, 2\]"):
        session.step(inputs.block_cond(cfg, 0), mouse[0], keyboard)


def test_a_finite_input_beyond_the_sessions_precision_is_named_as_such():
    """Converted to bf16, a finite 1e39 became Inf and was refused as 'non-finite (NaN or Inf)'."""
    cfg = load_config("universal-small")
    spec = PassSpec.from_config(cfg, "bf16")
    session = StreamingSession(TorchRunner(build_model(cfg, torch.bfloat16, seed=1), spec))
    inputs = synthetic_stream(cfg, 1, seed=0)
    session.start(inputs.visual_context)
    mouse, keyboard = inputs.block_actions(cfg, 0)
    cond = inputs.block_cond(cfg, 0).double()
    cond[0, 0, 0, 0, 0] = 1e39
    with pytest.raises(WanTrtError, match=r"cond_concat of block 0 holds values beyond torch.bfloat16's range "
                                          r"\(largest magnitude 1e\+39"):
        session.step(cond, mouse, keyboard)
    cond[0, 0, 0, 0, 0] = float("nan")
    with pytest.raises(WanTrtError, match="cond_concat of block 0 holds non-finite values"):
        session.step(cond, mouse, keyboard)


def test_a_noise_seed_is_an_integer_numpy_ones_included():
    """np.int64(7) was accepted and failed at the first step with an OverflowError naming no seed."""
    import numpy as np
    shape = (1, 2, 3)
    assert torch.equal(NoiseSource(np.int64(7))(0, 0, shape), NoiseSource(7)(0, 0, shape))
    for bad in (1.5, -1, True, 2 ** 64, "7"):
        with pytest.raises(WanTrtError, match="seed: expected an integer"):
            NoiseSource(bad)


def test_a_finite_visual_context_beyond_the_sessions_precision_is_named_as_such():
    """start() judged the image context after its conversion to bf16: a finite 1e39 was refused as NaN or Inf
    (step() judged its inputs as given). And start's shape error named the block of the stream before."""
    cfg = load_config("universal-small")
    session = StreamingSession(TorchRunner(build_model(cfg, torch.bfloat16, seed=1), PassSpec.from_config(cfg, "bf16")))
    context = synthetic_stream(cfg, 1, seed=0).visual_context.double()
    context[0, 0, 0] = 1e39
    with pytest.raises(WanTrtError, match=r"visual_context of the stream holds values beyond torch.bfloat16's "
                                          r"range \(largest magnitude 1e\+39"):
        session.start(context)
    with pytest.raises(WanTrtError, match=r"visual_context: expected shape \[1, 5, 32\] for the stream starting at "
                                          r"block 500 of 'universal-small', got \[1, 1, 32\]"):
        session.start(context[:, :1], start_block=500)


def test_a_held_action_of_another_width_is_named_as_given():
    """A held action [1, 3] for a 2-wide mouse was expanded first and reported as [1, 9, 3]."""
    cfg, session, inputs = _started("universal-small")
    _, keyboard = inputs.block_actions(cfg, 0)
    with pytest.raises(WanTrtError, match=r"mouse: expected \[1, 2\] \(one action held for block 0\) or \[1, 9, 2\] "
                                          r"\(one per video frame\), got \[1, 3\]"):
        session.step(inputs.block_cond(cfg, 0), torch.tensor([[0.1, 0.0, 0.5]]), keyboard)


def test_a_seed_beside_a_noise_source_is_refused():
    """StreamingSession(runner, seed=7, noise=NoiseSource(0)) drew seed 0's noise: the seed was dropped."""
    cfg = load_config("universal-small")
    runner = TorchRunner(build_model(cfg, torch.float32, seed=1), PassSpec.from_config(cfg, "fp32"))
    with pytest.raises(WanTrtError, match=r"seed 7 and a NoiseSource \(seed 0\) given"):
        StreamingSession(runner, seed=7, noise=NoiseSource(0))
    assert StreamingSession(runner, seed=7).noise.seed == 7
    assert StreamingSession(runner, noise=NoiseSource(5)).noise.seed == 5


def test_a_session_refuses_arguments_of_the_wrong_kind_naming_them():
    """A noise that is no NoiseSource, a runner that is no Runner and a decoder that is no DecoderStream raised an
    AttributeError from deep inside; a path where the seed goes is refused by NoiseSource, as it was."""
    cfg = load_config("universal-small")
    runner = TorchRunner(build_model(cfg), PassSpec.from_config(cfg, "fp32"))
    for kwargs, message in ((dict(runner=runner, seed="/tmp/x"), "seed: expected an int"),
                            (dict(runner=runner, noise=7), "noise: expected a NoiseSource"),
                            (dict(runner="out/export"), "runner: expected a Runner"),
                            (dict(runner=runner, decoder="out/dec"), "decoder: expected a DecoderStream")):
        with pytest.raises(WanTrtError, match=message):
            StreamingSession(**kwargs)


def test_an_image_context_with_an_autograd_graph_is_taken_as_its_values():
    """A CLIP encoder run without torch.no_grad() gives a context that is part of its autograd graph: start()
    copied it into the session's feed under autograd, so the feed kept the encoder's graph (the activations its
    backward would read) alive, and each new stream's start() chained that stream's graph onto the last: memory
    that grew with every stream. The feed takes the values only; the stream is the one of the plain tensor."""
    import gc
    import weakref
    cfg, session, inputs = _started("universal-small")
    mouse, keyboard = inputs.block_actions(cfg, 0)
    plain = session.step(inputs.block_cond(cfg, 0), mouse, keyboard).latents
    kept = []
    for _ in range(2):  # two streams: the second start() must not chain the first's graph either
        activation = inputs.visual_context.clone().requires_grad_(True) * 1.0  # what the encoder's backward reads
        kept.append(weakref.ref(activation))
        session.start(activation.abs() * activation.sign())  # the context's values; abs() saves the activation
        del activation
        gc.collect()
        assert not session.feeds["visual_context"].requires_grad
        assert torch.equal(session.step(inputs.block_cond(cfg, 0), mouse, keyboard).latents, plain)
    assert [ref() for ref in kept] == [None, None]


def test_a_runner_of_the_decoders_graph_is_refused_naming_it():
    """A decoder call's runner given as the session's runner (a Runner, of another graph) failed with an
    AttributeError from deep inside ('DecoderSpec' object has no attribute 'rotaries')."""
    from wan_trt.decoder_spec import DecoderSpec
    from wan_trt.model import build_decoder
    cfg = load_config("universal-small")
    decoder_runner = TorchRunner(build_decoder(cfg, seed=1), DecoderSpec.from_config(cfg, "fp32", "steady"))
    with pytest.raises(WanTrtError, match=r"runner: torch runs the decoder graph, not the DiT's pass"):
        StreamingSession(decoder_runner)


def test_a_step_refuses_tensors_without_values_or_of_another_kind(universal_small):
    """The session's checks let a meta tensor and a sparse one through to torch's copy (NotImplementedError,
    RuntimeError), and converted boolean or integer image features without a word. Actions may still be 0/1
    integers or booleans (a keyboard's keys)."""
    cfg, model, inputs = universal_small
    session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")), noise=NoiseSource(5))
    visual = inputs.visual_context
    for value, message in ((visual.to("meta"), "a meta tensor"), (visual.bool(), "expected a floating-point tensor"),
                           (visual.long(), "expected a floating-point tensor")):
        with pytest.raises(WanTrtError, match=f"visual_context: .*{message}"):
            session.start(value)
    session.start(visual)
    cond = inputs.block_cond(cfg, 0)
    mouse, keyboard = inputs.block_actions(cfg, 0)
    with pytest.raises(WanTrtError, match="cond_concat: .*a torch.sparse_coo tensor"):
        session.step(cond.to_sparse(), mouse, keyboard)
    with pytest.raises(WanTrtError, match="keyboard: .*a torch.sparse_coo tensor"):  # one held over the block
        session.step(cond, mouse, keyboard[:, 0].to_sparse())
    session.step(cond, mouse, (keyboard > 0.5).long())  # 0/1 keys as integers: taken
