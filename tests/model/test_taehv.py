"""The tiny decoder against an independent transcription of TAEHV's whole-clip decode (its memory blocks read
their input shifted by one frame, zeros first; the first 3 frames trimmed, [0, 1] clamped), its parameter
names against TAEHV's, and its checkpoint loading."""
import pytest
import torch
import torch.nn.functional as F

from wan_trt.errors import WanTrtError
from wan_trt.model import build_tiny_decoder
from wan_trt.model.checkpoint import load_tiny_decoder
from wan_trt.model.init import random_init
from wan_trt.model.taehv import MemBlock, TGrow, TinyDecoder

H, W = 4, 6  # latents


def _model(seed=0) -> TinyDecoder:
    return random_init(TinyDecoder(), seed).eval()


def taehv_whole_clip(model: TinyDecoder, z: torch.Tensor) -> torch.Tensor:
    """TAEHV's parallel decode of z [1, 16, T, h, w] -> [1, 3, 4T - 3, 8h, 8w] in [-1, 1] (its [0, 1] mapped)."""
    x = z.transpose(1, 2)[0]  # [T, C, h, w]: batch 1, frames as the batch
    for block in model.decoder:
        if isinstance(block, MemBlock):
            past = F.pad(x, (0, 0, 0, 0, 0, 0, 1, 0))[:-1]  # the same input one frame earlier, zeros first
            x = torch.relu(block.conv(torch.cat([x, past], 1)) + x)
        elif isinstance(block, TGrow):
            t, c, h, w = x.shape
            x = block.conv(x).reshape(t * block.stride, c, h, w)
        else:
            x = block(x)
    return (x[3:].clamp(0, 1) * 2 - 1).transpose(0, 1)[None]


@torch.no_grad()
@pytest.mark.parametrize("chunk", [1, 3])
def test_streaming_in_chunks_equals_taehvs_whole_clip_decode(chunk):
    model = _model()
    z = torch.randn(1, 16, 6, H, W, generator=torch.Generator().manual_seed(1))
    expected = taehv_whole_clip(model, z)
    history, frames = model.empty_history(1, H, W), []
    for start in range(0, z.shape[2], chunk):
        rgb, history = model(z[:, :, start:start + chunk], history, first=start == 0)
        assert rgb.shape[2] == model.video_frames(chunk, first=start == 0)
        frames.append(rgb)
    assert expected.shape == (1, 3, 4 * 6 - 3, 8 * H, 8 * W)
    torch.testing.assert_close(torch.cat(frames, 2), expected, rtol=0, atol=2e-4)  # frames in [-1, 1]


@torch.no_grad()
def test_histories_matter():
    """A steady call from empty histories differs from one after a first call: the memory blocks read them."""
    model = _model()
    z = torch.randn(1, 16, 6, H, W, generator=torch.Generator().manual_seed(2))
    _, history = model(z[:, :, :3], model.empty_history(1, H, W), first=True)
    carried, _ = model(z[:, :, 3:], history, first=False)
    fresh, _ = model(z[:, :, 3:], model.empty_history(1, H, W), first=False)
    assert (carried - fresh).abs().max() > 1e-3


def test_taehvs_parameter_names_and_shapes():
    """Spot checks of taew2_1.pth's decoder keys (TAEHV's nn.Sequential indices) and the 9 memory blocks."""
    with torch.device("meta"):
        model = TinyDecoder()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    expected = {
        "decoder.1.weight": (256, 16, 3, 3),
        "decoder.3.conv.0.weight": (256, 512, 3, 3),
        "decoder.5.conv.4.bias": (256,),
        "decoder.7.conv.weight": (256, 256, 1, 1),  # the first stage keeps its frames
        "decoder.8.weight": (128, 256, 3, 3),
        "decoder.13.conv.weight": (256, 128, 1, 1),  # x2 in time
        "decoder.14.weight": (64, 128, 3, 3),
        "decoder.17.conv.2.weight": (64, 64, 3, 3),
        "decoder.19.conv.weight": (128, 64, 1, 1),
        "decoder.20.weight": (64, 64, 3, 3),
        "decoder.22.weight": (3, 64, 3, 3),
        "decoder.22.bias": (3,),
    }
    for key, shape in expected.items():
        assert shapes.get(key) == shape, key
    assert "decoder.8.bias" not in shapes and "decoder.20.bias" not in shapes
    assert sum(v.numel() for v in model.state_dict().values()) == 9_844_611
    assert [path for path, _ in model.history_layout(1, 44, 80)] == [f"decoder.{i}" for i in
                                                                     (3, 4, 5, 9, 10, 11, 15, 16, 17)]


def _write_taehv_file(model, path, **extra):
    """A whole TAEHV file: decoder keys plus encoder keys the decoder skips."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    state.update({"encoder.0.weight": torch.zeros(64, 3, 3, 3), "encoder.0.bias": torch.zeros(64)}, **extra)
    torch.save(state, path)
    return state


def test_a_taehv_checkpoint_loads_strictly_and_decodes_as_saved(tmp_path):
    model = _model(3)
    _write_taehv_file(model, tmp_path / "taew2_1.pth")
    from wan_trt.config_load import load_config
    loaded = build_tiny_decoder(load_config("universal-small"), weights=tmp_path / "taew2_1.pth")
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_a_corrupted_taehv_checkpoint_names_its_keys(tmp_path):
    state = _write_taehv_file(_model(3), tmp_path / "taew2_1.pth")
    del state["decoder.22.bias"]
    state["decoder.13.conv.weight"] = torch.zeros(128, 128, 1, 1)  # a TGrow of stride 1 where TAEHV's doubles
    state["decoder.99.weight"] = torch.zeros(1)
    torch.save(state, tmp_path / "bad.pth")
    with pytest.raises(WanTrtError) as err:
        load_tiny_decoder(TinyDecoder(), tmp_path / "bad.pth")
    message = str(err.value)
    for part in ("--vae-weights", "1 missing key(s): decoder.22.bias", "1 unexpected key(s): decoder.99.weight",
                 "decoder.13.conv.weight: checkpoint (128, 128, 1, 1)", "taew2_1.pth"):
        assert part in message, message


def test_a_taehv_file_given_for_the_wan_decoder_is_refused_saying_where_it_goes(tmp_path):
    """taew2_1.pth given to the Wan decoder (`stream`'s default, `export --graph decoder`) was refused with its 172
    keys listed and 'pass the Wan2.1 VAE', nothing about the tiny decoder it is for."""
    from wan_trt.model.checkpoint import load_vae_decoder
    from wan_trt.model.vae import DecoderConfig, VideoDecoder
    _write_taehv_file(_model(), tmp_path / "taew2_1.pth")
    with pytest.raises(WanTrtError, match=r"(?s)TAEHV's keys .*`stream --decoder tiny` or `export --graph tiny-decoder`"):
        load_vae_decoder(VideoDecoder(DecoderConfig(dim=8)), tmp_path / "taew2_1.pth")


def test_a_wan_vae_given_for_the_tiny_decoder_is_refused_saying_which_file_fits(tmp_path):
    from wan_trt.model.vae import DecoderConfig, VideoDecoder
    torch.save(VideoDecoder(DecoderConfig(dim=8)).state_dict(), tmp_path / "Wan2.1_VAE.pth")
    with pytest.raises(WanTrtError, match=r"(?s)^--vae-weights .*taew2_1.pth.*Wan2.1_VAE.pth"):
        load_tiny_decoder(TinyDecoder(), tmp_path / "Wan2.1_VAE.pth")
