"""A session with a decoder yields each block's frames; what may be attached, and when."""
import dataclasses

import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.decoder_spec import CALLS, DecoderSpec
from wan_trt.engines.backends.torch import TorchRunner
from wan_trt.engines.runtime.decoder import DecoderStream
from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
from wan_trt.errors import WanTrtError
from wan_trt.model import build_decoder, build_model
from wan_trt.spec import PassSpec
from wan_trt.stream import NoiseSource, synthetic_stream
from wan_trt.validate.check_decoder import decode_whole_clip
from wan_trt.video import to_uint8_frames

CFG = "gta_drive-small"


def _decoder(cfg, precision="fp32", seed=2):
    module = build_decoder(cfg, {"fp32": torch.float32, "bf16": torch.bfloat16}[precision], "cpu", seed=seed)
    return module, DecoderStream(*(TorchRunner(module, DecoderSpec.from_config(cfg, precision, c)) for c in CALLS))


def _decoding_session(blocks: int):
    """(config, decoder module, its DecoderStream, ``blocks`` blocks of inputs, a session decoding with it)."""
    cfg = load_config(CFG)
    model = build_model(cfg, torch.float32, "cpu", seed=1)
    module, decoder = _decoder(cfg)
    session = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")), noise=NoiseSource(3),
                               decoder=decoder)
    return cfg, module, decoder, synthetic_stream(cfg, blocks, seed=3), session


def test_step_yields_the_frames_of_its_latents_with_stage_times():
    """9 frames for the first block, 12 after, uint8 [n, H, W, 3]: the decode of all the stream's
    latents at once; every stage timed."""
    cfg, module, decoder, inputs, session = _decoding_session(8)
    results = stream_blocks(session, inputs, 8)
    assert [r.frames.shape for r in results] == [(9, 32, 48, 3)] + [(12, 32, 48, 3)] * 7
    assert all(r.frames.dtype == torch.uint8 for r in results)
    assert all(set(r.stage_ms) == {"passes", "clean", "checks", "decode", "commit"} and min(r.stage_ms.values()) >= 0
               for r in results)
    whole = to_uint8_frames(decode_whole_clip(module, torch.cat([r.latents for r in results], dim=2)))
    assert (torch.cat([r.frames for r in results]).int() - whole.int()).abs().max() <= 1
    again = stream_blocks(session, inputs, 2)  # a new stream restarts the decoder too
    assert [r.frames.shape[0] for r in again] == [9, 12] and torch.equal(again[0].frames, results[0].frames)


def test_a_decoder_that_does_not_fit_the_stream_is_refused():
    cfg = load_config(CFG)
    model = build_model(cfg, torch.float32, "cpu", seed=1)
    runner = TorchRunner(model, PassSpec.from_config(cfg, "fp32"))
    with pytest.raises(WanTrtError, match="from the same config, in the DiT.s latent dtype"):
        StreamingSession(runner, decoder=_decoder(cfg, "bf16")[1])
    wider = dataclasses.replace(cfg, inference=dataclasses.replace(cfg.inference, latent_width=8))
    with pytest.raises(WanTrtError, match=r"takes latents \[1, 16, 3, 4, 8\]"):  # another resolution
        StreamingSession(runner, decoder=_decoder(wider)[1])
    inputs = synthetic_stream(cfg, 2, seed=3)
    session = StreamingSession(runner, noise=NoiseSource(3))
    stream_blocks(session, inputs, 1)
    with pytest.raises(WanTrtError, match="would lack the histories"):
        session.attach_decoder(_decoder(cfg)[1])
    assert session.decoder is None
    session.start(inputs.visual_context)  # a new stream: attaching before its first step is fine
    late = _decoder(cfg)[1]
    session.attach_decoder(late)
    assert late.first.is_active and late.steady.is_active  # activated like the session's runner
    mouse, keyboard = inputs.block_actions(cfg, 0)
    assert session.step(inputs.block_cond(cfg, 0), mouse, keyboard).frames.shape[0] == 9
    steady = _decoder(cfg)[1].steady
    with pytest.raises(WanTrtError, match="does not run the first decoder graph"):
        DecoderStream(steady, steady)


def test_a_decoder_serves_one_session_at_a_time():
    """Two sessions given one decoder: the second's start() reset the histories under the first, whose next
    block was then decoded as a new stream's first (9 frames, not 12), without a word."""
    cfg = load_config(CFG)
    model = build_model(cfg, torch.float32, "cpu", seed=1)
    _, decoder = _decoder(cfg)
    first = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")), decoder=decoder)
    with pytest.raises(WanTrtError, match="attached to another session"):
        StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")), decoder=decoder)
    inputs = synthetic_stream(cfg, 2, seed=3)
    assert [r.frames.shape[0] for r in stream_blocks(first, inputs, 2)] == [9, 12]
    first.detach_decoder()  # then another session may take it
    second = StreamingSession(TorchRunner(model, PassSpec.from_config(cfg, "fp32")), decoder=decoder)
    assert [r.frames.shape[0] for r in stream_blocks(second, inputs, 2)] == [9, 12]
    assert first.decoder is None


def test_a_decoder_that_fails_to_load_leaves_nothing_loaded_or_switched_on():
    """A failed enter left the first call's runner loaded and cuDNN's process-wide benchmark mode on."""
    _, decoder = _decoder(load_config(CFG))

    def fail():
        raise RuntimeError("the steady engine failed to load")
    decoder.steady.activate = fail
    before = torch.backends.cudnn.benchmark
    with pytest.raises(RuntimeError, match="failed to load"):
        decoder.__enter__()
    assert not decoder.first.is_active and torch.backends.cudnn.benchmark == before


def test_frames_that_come_out_non_finite_refuse_the_block():
    """A decoder whose frames come out NaN (here a NaN head bias; in practice weights that overflow) made
    black frames of them (uint8 turns NaN into 0) and the step passed. The step is refused instead, naming
    the frames, with nothing committed: its caches and the decoder's histories stay as they were."""
    from wan_trt.engines.runtime.finite import NonFiniteBlock
    cfg, module, decoder, inputs, session = _decoding_session(3)
    good = stream_blocks(session, inputs, 3)
    stream_blocks(session, inputs, 1)
    histories = {name: t.clone() for name, t in decoder.feeds.items()}
    bias = module.decoder.head[2].bias
    kept = bias.clone()
    bias.fill_(float("nan"))
    mouse, keyboard = inputs.block_actions(cfg, 1)
    with pytest.raises(NonFiniteBlock, match="rgb of block 1 came out non-finite") as refused:
        session.step(inputs.block_cond(cfg, 1), mouse, keyboard)
    assert refused.value.tensor == "rgb" and session.block == 1
    assert all(torch.equal(decoder.feeds[n], t) for n, t in histories.items() if n != "latents")
    bias.copy_(kept)  # the same block again, now decodable: as if never refused
    again = [session.step(inputs.block_cond(cfg, b), *inputs.block_actions(cfg, b)) for b in (1, 2)]
    assert all(torch.equal(a.frames, g.frames) and torch.equal(a.latents, g.latents) for a, g in zip(again, good[1:]))


def test_latents_with_an_autograd_graph_are_decoded_as_their_values():
    """decode() copied latents that are part of an autograd graph into its feed under autograd: the feed kept the
    caller's graph alive, each call chaining the next onto it (memory that grew with every block decoded)."""
    import gc
    import weakref
    cfg = load_config(CFG)
    module, decoder = _decoder(cfg)
    latents = torch.randn(1, 16, 3, 4, 6, generator=torch.Generator().manual_seed(0))
    with decoder:
        plain = [decoder.decode(latents).clone() for _ in range(2)]
        decoder.reset()
        kept = []
        for expected in plain:
            activation = latents.clone().requires_grad_(True) * 1.0
            kept.append(weakref.ref(activation))
            frames = decoder.decode(activation.abs() * activation.sign())  # the values; abs() saves the activation
            del activation
            gc.collect()
            assert torch.equal(frames, expected) and not decoder.feeds["latents"].requires_grad
    assert [ref() for ref in kept] == [None, None]


def test_a_decoder_engine_that_is_not_there_is_named_as_missing(tmp_path):
    """DecoderStream.from_engine with a mistyped engine path said its 'other graph's engine' was missing, listing the
    path given among the other's, or, outside first/ and steady/, that the folder was no decoder export."""
    steady = tmp_path / "dec" / "steady"
    steady.mkdir(parents=True)
    (tmp_path / "dec" / "first").mkdir()
    for engine in (steady / "engine_aoti_cpu.pt2", tmp_path / "engine_aoti_cpu.pt2"):
        with pytest.raises(WanTrtError, match=f"^decoder engine {engine}: no such file$"):
            DecoderStream.from_engine(engine, "aoti", "cpu")


def test_a_decoder_call_refuses_what_is_not_latents_in_a_line():
    """DecoderStream checked the latents' shape only: a list or None ended in AttributeError, a meta tensor in
    NotImplementedError, integer latents were converted without a word, a runner of None in AttributeError; NaN
    latents were reported as frames that came out non-finite, blaming the VAE weights."""
    cfg = load_config(CFG)
    _, decoder = _decoder(cfg)
    with pytest.raises(WanTrtError, match="first runner: expected a Runner"):
        DecoderStream(None, None)
    shape = decoder.spec.tensor("latents").shape
    latents = torch.randn(shape)
    bad = {"expected a torch.Tensor": [1, 2], "a meta tensor": latents.to("meta"),
           "expected a floating-point tensor": latents.long(), "expected a real tensor": latents.to(torch.complex64),
           "a torch.sparse_coo tensor": latents.to_sparse(), "expected shape": latents[:, :, :1]}
    with decoder:
        for message, value in bad.items():
            with pytest.raises(WanTrtError, match=f"decoder latents: .*{message}"):
                decoder.decode(value)
        assert not decoder.started  # nothing ran
        with pytest.raises(WanTrtError, match="the decoder's latents are non-finite"):
            decoder.decode(torch.full(shape, float("nan")))
        assert decoder.decode(latents).dtype == torch.uint8
