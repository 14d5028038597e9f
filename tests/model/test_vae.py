"""The video decoder against an independent transcription of upstream's frame-by-frame decode
(list of feature caches, 'Rep' markers), and its parameter names against upstream's."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from wan_trt.errors import WanTrtError
from wan_trt.model.checkpoint import load_vae_decoder
from wan_trt.model.vae import (AttentionBlock, CausalConv3d, DecoderConfig, Histories, Resample, ResidualBlock,
                               VideoDecoder)

SMALL = DecoderConfig(dim=8)
CACHE_T = 2


def upstream_conv(conv, x, cache=None):
    """Upstream CausalConv3d.forward: the cache replaces part of the front zero padding."""
    pt, ph, pw = (conv.history_frames // 2, *(conv.spatial_pad[2], conv.spatial_pad[0]))
    padding = [pw, pw, ph, ph, 2 * pt, 0]
    if cache is not None and 2 * pt > 0:
        x = torch.cat([cache, x], dim=2)
        padding[4] -= cache.shape[2]
    return F.conv3d(F.pad(x, padding), conv.weight, conv.bias, conv.stride)


def upstream_cached(conv, x, feat, idx):
    """The cache handling upstream repeats around every cached causal convolution."""
    cache_x = x[:, :, -CACHE_T:].clone()
    if cache_x.shape[2] < 2 and feat[idx[0]] is not None:
        cache_x = torch.cat([feat[idx[0]][:, :, -1:], cache_x], dim=2)
    x = upstream_conv(conv, x, feat[idx[0]])
    feat[idx[0]] = cache_x
    idx[0] += 1
    return x


def upstream_upsample3d(layer, x, feat, idx):
    b, c, t, h, w = x.shape
    i = idx[0]
    if feat[i] is None:
        feat[i] = "Rep"
        idx[0] += 1
        return x
    cache_x = x[:, :, -CACHE_T:].clone()
    if cache_x.shape[2] < 2 and not isinstance(feat[i], str):
        cache_x = torch.cat([feat[i][:, :, -1:], cache_x], dim=2)
    if cache_x.shape[2] < 2 and isinstance(feat[i], str):
        cache_x = torch.cat([torch.zeros_like(cache_x), cache_x], dim=2)
    x = upstream_conv(layer.time_conv, x, None if isinstance(feat[i], str) else feat[i])
    feat[i] = cache_x
    idx[0] += 1
    x = x.reshape(b, 2, c, t, h, w)
    return torch.stack((x[:, 0], x[:, 1]), 3).reshape(b, c, t * 2, h, w)


def upstream_decoder_call(dec, x, feat, idx):
    x = upstream_cached(dec.conv1, x, feat, idx)
    for layer in (*dec.middle, *dec.upsamples):
        if isinstance(layer, ResidualBlock):
            h = x if layer.shortcut is None else upstream_conv(layer.shortcut, x)
            for sub in layer.residual:
                x = upstream_cached(sub, x, feat, idx) if isinstance(sub, CausalConv3d) else sub(x)
            x = x + h
        elif isinstance(layer, Resample):
            if layer.mode == "upsample3d":
                x = upstream_upsample3d(layer, x, feat, idx)
            t = x.shape[2]
            y = layer.resample(x.permute(0, 2, 1, 3, 4).flatten(0, 1))
            x = y.unflatten(0, (-1, t)).permute(0, 2, 1, 3, 4)
        else:
            assert isinstance(layer, AttentionBlock)
            x = layer(x)
    x = dec.head[1](dec.head[0](x))
    return upstream_cached(dec.head[2], x, feat, idx)


def upstream_decode(model: VideoDecoder, z):
    """WanVAE_.decode: de-normalise, conv2, then one latent frame at a time with the caches."""
    x = upstream_conv(model.conv2, z * model.std + model.mean)
    feat = [None] * 32
    out = [upstream_decoder_call(model.decoder, x[:, :, i:i + 1], feat, [0]) for i in range(z.shape[2])]
    return torch.cat(out, dim=2).clamp(-1, 1)


def _small_model(seed=0):
    torch.manual_seed(seed)
    model = VideoDecoder(SMALL).eval()
    with torch.no_grad():  # upstream zero-initialises the attention output; random here so it counts
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@torch.no_grad()
def test_streaming_in_chunks_equals_upstreams_frame_by_frame_decode():
    """Latent frame 0 alone, then chunks of 2, 3, 1, 3, 3 frames with the histories carried: the
    same frames as upstream's decode of the whole clip (13 latent frames -> 49 video frames)."""
    model = _small_model()
    z = torch.randn(1, 16, 13, 4, 6)
    expected = upstream_decode(model, z)
    history = model.empty_history(1, 4, 6)
    outs, start = [], 0
    for size in (1, 2, 3, 1, 3, 3):
        frames, history = model(z[:, :, start:start + size], history, first=start == 0)
        assert frames.shape[2] == SMALL.video_frames(size, start == 0)
        outs.append(frames)
        start += size
    got = torch.cat(outs, dim=2)
    assert got.shape == expected.shape == (1, 3, 1 + 4 * 12, 32, 48)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)


@torch.no_grad()
def test_a_first_chunk_of_several_frames_equals_frame_by_frame():
    """The DiT's first block (3 latent frames) decoded in one call: 1 + 4 + 4 video frames."""
    model = _small_model(1)
    z = torch.randn(1, 16, 3, 4, 6)
    frames, _ = model(z, model.empty_history(1, 4, 6), first=True)
    torch.testing.assert_close(frames, upstream_decode(model, z), rtol=0, atol=2e-5)


@torch.no_grad()
def test_histories_matter():
    """Decoding a chunk without the history of the frames before it gives other frames."""
    model = _small_model(2)
    z = torch.randn(1, 16, 4, 4, 6)
    _, history = model(z[:, :, :1], model.empty_history(1, 4, 6), first=True)
    with_history, _ = model(z[:, :, 1:], history, first=False)
    without, _ = model(z[:, :, 1:], model.empty_history(1, 4, 6), first=False)
    assert (with_history - without).abs().max() > 1e-2


class OpCounter(TorchDispatchMode):
    """Counts the wan_trt ops that run inside it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "wan_trt":
            self.names.append(func._opname)
        return func(*args, **(kwargs or {}))

    def count(self, name: str) -> int:
        return self.names.count(name)


@pytest.mark.parametrize("fused", [False, True], ids=["native", "fused"])
@torch.no_grad()
def test_the_engine_form_decodes_as_the_reference(fused):
    """The form graphs hold (channels-last convolutions padding their own borders, 96-channel ones
    computing 128 outputs, the attention by explicit products, the head by one GEMM of its taps;
    with ``fused``, the norms as the fused ops, in Triton's interpreter here) decodes a stream as the
    reference."""
    torch.manual_seed(3)
    reference = VideoDecoder(DecoderConfig(dim=24)).eval()  # stages of 96, 96, 96, 48, 24 channels
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    engine = VideoDecoder(DecoderConfig(dim=24)).eval()
    engine.load_state_dict(reference.state_dict())
    engine.use_engine_form(fused).use_engine_form(fused)  # preparing twice changes nothing
    padded = [m for m in engine.modules() if isinstance(m, CausalConv3d) and m.weight.shape[0] != m.out_channels]
    assert len(padded) > 10 and all(m.weight.shape[0] == 128 for m in padded)
    z = torch.randn(1, 16, 5, 2, 3)
    got, want = engine.empty_history(1, 2, 3), reference.empty_history(1, 2, 3)
    for start, end in ((0, 2), (2, 5)):
        with OpCounter() as ops:
            frames, got = engine(z[:, :, start:end], got, first=start == 0)
        # 14 residual blocks: 14 second norms and the 5 first ones after conv1, the attention or a resample
        # plain; the other 9 first ones and the head's add the previous block's residual sum
        assert (ops.count("norm_silu_join"), ops.count("add_norm_silu_join")) == ((19, 10) if fused else (0, 0))
        expected, want = reference(z[:, :, start:end], want, first=start == 0)
        for a, b in zip([frames, *got], [expected, *want]):
            assert_fp32_close(a, b)


def assert_fp32_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal up to fp32 rounding in another order of operations: rel-L2 <= 1e-5, and every element within 1e-5
    of its own magnitude plus 1e-5 of the tensor's largest one (at least 1). An absolute 1e-5 failed on a
    history whose values reach 15: 1.05e-5 off at rel-L2 7e-7, on one CPU's convolution kernels and not on
    another's."""
    assert actual.shape == expected.shape and torch.isfinite(actual).all()
    scale = max(1.0, float(expected.abs().max()))
    rel_l2 = float((actual - expected).norm() / expected.norm()) if expected.norm() > 0 else float(actual.norm())
    assert rel_l2 <= 1e-5, rel_l2
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale)


class ConvolutionWidths(TorchDispatchMode):
    """The output channels of every convolution that runs inside it."""

    def __init__(self):
        super().__init__()
        self.widths = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.convolution.default and not args[6]:  # not transposed
            self.widths.append(args[1].shape[0])
        return func(*args, **(kwargs or {}))


@torch.no_grad()
def test_the_fused_form_computes_192_channel_convolutions_as_128_and_64():
    """With the fused norms, each residual block's convolution with 192 outputs runs as two, of 128 and 64
    outputs, which the split norms read without joining them; the stream decodes as the reference."""
    torch.manual_seed(6)
    reference = VideoDecoder(DecoderConfig(dim=48)).eval()  # stages of 192, 192, 192, 96, 48 channels
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    z = torch.randn(1, 16, 3, 2, 3)
    widths, ops = {}, {}
    for fused in (False, True):
        engine = VideoDecoder(DecoderConfig(dim=48)).eval()
        engine.load_state_dict(reference.state_dict())
        engine.use_engine_form(fused).use_engine_form(fused)  # preparing twice changes nothing
        got, want = engine.empty_history(1, 2, 3), reference.empty_history(1, 2, 3)
        for start, end in ((0, 1), (1, 3)):
            with ConvolutionWidths() as conv, OpCounter() as counter:
                frames, got = engine(z[:, :, start:end], got, first=start == 0)
            expected, want = reference(z[:, :, start:end], want, first=start == 0)
            torch.testing.assert_close(frames, expected, rtol=1e-4, atol=1e-4)  # 192-channel sums: fp32 order
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
        widths[fused], ops[fused] = conv.widths, counter.names
    # the middle's 2 and the first two stages' 3 + 3 residual blocks: 16 convolutions of 192 outputs
    assert widths[True].count(192) == widths[False].count(192) - 16
    assert widths[True].count(64) == widths[False].count(64) + 16
    assert widths[True].count(128) == widths[False].count(128) + 16
    # each of those 8 blocks' second norm reads its first convolution's two parts; a first norm reads (and
    # sums) them right after another of them: stage 0's 3 (its first after the middle's last) and stage 1's
    # last 2, not after the attention or a resample
    assert ops[True].count("split_norm_silu_join") == 8 and ops[True].count("split_add_norm_silu_join") == 3 + 2


@pytest.mark.parametrize("mode", ["upsample2d", "upsample3d"])
@torch.no_grad()
def test_the_engine_form_upsamples_by_a_transposed_convolution_with_fewer_multiply_adds(mode):
    """The engine form's x2 upsampling (a stride-2 transposed convolution of the low-res frames)
    equals nearest x2 then the 3x3 convolution, on odd frame sizes and at the borders, and does
    16/36 of the reference's multiply-adds (no work on padding)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(5)
    reference = Resample(6, mode).eval()
    engine = Resample(6, mode).eval()
    engine.load_state_dict(reference.state_dict())
    engine.use_engine_form()
    engine.use_engine_form()  # preparing twice changes nothing
    x, history = torch.randn(1, 6, 3, 5, 7), torch.randn(1, 6, 2, 5, 7)
    outputs, counts = [], []
    for module in (reference, engine):
        with FlopCounterMode(display=False) as counter:
            outputs.append(module(x, Histories([history]), first=False))
        counts.append(counter.get_flop_counts()["Global"][torch.ops.aten.convolution])
    frames = 6 if mode == "upsample3d" else 3
    assert outputs[0].shape == (1, 3, frames, 10, 14)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    time_conv = 2 * 3 * 5 * 7 * 12 * 6 * 3 if mode == "upsample3d" else 0
    spatial = [count - time_conv for count in counts]
    assert spatial[0] == 2 * frames * 10 * 14 * 3 * 6 * 9
    assert spatial[1] * 36 == spatial[0] * 16


class UpsamplingReads(TorchDispatchMode):
    """Records the transposed convolutions (an engine form's upsamplings): whether each got its bias, and
    how many of their outputs an elementwise add reads."""

    def __init__(self):
        super().__init__()
        self.biased, self.outputs, self.added = [], {}, set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.convolution.default and args[6]:  # transposed
            self.biased.append(args[2] is not None)
            self.outputs[out.untyped_storage().data_ptr()] = out  # kept alive: its memory is not reused
        elif func is torch.ops.aten.add.Tensor:
            self.added.update(p for a in args if isinstance(a, torch.Tensor)
                              and (p := a.untyped_storage().data_ptr()) in self.outputs)
        return out

    def added_outputs(self) -> int:
        return len(self.added)


@torch.no_grad()
def test_the_fused_form_adds_an_upsamplings_bias_where_its_output_is_read():
    """With the fused norms, an upsampling's output leaves its convolution without the bias: the next norm
    adds it, and the residual sum after it takes it into its own bias. Only the upsampling that feeds a
    1x1 shortcut convolution (which needs the sum) is summed apart. Unfused, each adds its bias."""
    torch.manual_seed(4)
    model = VideoDecoder(DecoderConfig(dim=24)).eval()  # 3 upsamplings, the first feeding a 48 -> 96 shortcut
    z = torch.randn(1, 16, 3, 2, 3)
    counts = {}
    for fused in (False, True):
        model.use_engine_form(fused)
        with UpsamplingReads() as reads:
            model(z, model.empty_history(1, 2, 3), first=False)
        counts[fused] = (reads.biased, reads.added_outputs())
    assert counts[False][0] == [True] * 3
    assert counts[True] == ([False] * 3, 1)


def test_upstream_parameter_names_and_shapes():
    """Spot checks of the Wan2.1 VAE decoder's state dict (dim 96) and its 32 cached convolutions."""
    with torch.device("meta"):
        model = VideoDecoder(DecoderConfig())
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = {
        "conv2.weight": (16, 16, 1, 1, 1),
        "decoder.conv1.weight": (384, 16, 3, 3, 3),
        "decoder.middle.0.residual.0.gamma": (384, 1, 1, 1),
        "decoder.middle.1.to_qkv.weight": (1152, 384, 1, 1),
        "decoder.middle.1.norm.gamma": (384, 1, 1),
        "decoder.upsamples.3.time_conv.weight": (768, 384, 3, 1, 1),
        "decoder.upsamples.3.resample.1.weight": (192, 384, 3, 3),
        "decoder.upsamples.4.shortcut.weight": (384, 192, 1, 1, 1),
        "decoder.upsamples.7.time_conv.bias": (768,),
        "decoder.upsamples.11.resample.1.weight": (96, 192, 3, 3),
        "decoder.upsamples.14.residual.6.weight": (96, 96, 3, 3, 3),
        "decoder.head.0.gamma": (96, 1, 1, 1),
        "decoder.head.2.weight": (3, 96, 3, 3, 3),
    }
    for key, shape in expected.items():
        assert shapes.get(key) == shape, key
    assert "decoder.upsamples.11.time_conv.weight" not in shapes  # the last stage is spatial only
    assert not any(k.endswith(("mean", "std")) for k in shapes)  # statistics are not in the checkpoint
    assert len(model.history_shapes(1, 44, 80)) == 32


def _write_vae_file(model, path, **extra):
    """A whole-VAE file as upstream saves it: decoder keys plus encoder keys the decoder skips."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state.update({"encoder.conv1.weight": torch.zeros(96, 3, 3, 3, 3), "conv1.bias": torch.zeros(32)}, **extra)
    torch.save(state, path)
    return state


def test_a_vae_checkpoint_with_upstream_names_loads_strictly(tmp_path):
    model = _small_model(3)
    _write_vae_file(model, tmp_path / "vae.pth")
    loaded = load_vae_decoder(VideoDecoder(SMALL), tmp_path / "vae.pth")
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_a_corrupted_vae_checkpoint_names_its_keys(tmp_path):
    model = _small_model(3)
    state = _write_vae_file(model, tmp_path / "vae.pth")
    del state["decoder.head.2.bias"]
    state["decoder.upsamples.3.time_conv.weight"] = torch.zeros(1, 2, 3)
    state["decoder.extra.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(WanTrtError) as err:
        load_vae_decoder(VideoDecoder(SMALL), tmp_path / "bad.pth")
    message = str(err.value)
    for part in ("--vae-weights", "1 missing key(s): decoder.head.2.bias", "1 unexpected key(s): decoder.extra.weight",
                 "decoder.upsamples.3.time_conv.weight: checkpoint (1, 2, 3)"):
        assert part in message, message



@pytest.mark.parametrize("content, name", [("not a checkpoint", "bad.jsonl"), (None, "tensor.pt")])
def test_an_unreadable_vae_checkpoint_is_named_by_its_own_flag(tmp_path, content, name):
    """The reader's refusals said '--weights PATH' for a --vae-weights file."""
    path = tmp_path / name
    if content is None:
        torch.save(torch.zeros(3), path)
    else:
        path.write_text(content)
    with pytest.raises(WanTrtError, match=r"^--vae-weights "):
        load_vae_decoder(VideoDecoder(SMALL), path)


def test_a_damaged_vae_checkpoint_is_named_by_its_own_flag(tmp_path):
    """check_values said '--weights PATH' for a --vae-weights file holding NaN."""
    state = {k: v.clone() for k, v in VideoDecoder(SMALL).state_dict().items()}
    key = next(k for k, v in state.items() if v.is_floating_point() and v.numel() > 1)
    state[key].view(-1)[0] = float("nan")
    torch.save(state, tmp_path / "nan.pth")
    with pytest.raises(WanTrtError, match=r"^--vae-weights .*NaN"):
        load_vae_decoder(VideoDecoder(SMALL), tmp_path / "nan.pth")


def test_a_vae_of_another_width_says_which_config_fits(tmp_path):
    """A full-width Wan2.1 VAE given with a -small config (vae_dim 8) was told to 'pass the Wan2.1 VAE'."""
    wide = VideoDecoder(dataclasses.replace(SMALL, dim=SMALL.dim * 2))
    _write_vae_file(wide, tmp_path / "wide.pth")
    with pytest.raises(WanTrtError, match=rf"the file's decoder is {SMALL.dim * 2} wide \(decoder.conv1.bias: "
                                          rf"{SMALL.dim * 8} channels\), the config's {SMALL.dim}"):
        load_vae_decoder(VideoDecoder(SMALL), tmp_path / "wide.pth")
