"""Loading and writing checkpoints with upstream key names.

Upstream files (``base_distill.safetensors`` ...) hold the CausalWanModel state dict
with keys prefixed ``model.`` (the diffusion wrapper's attribute). Accepted here:
``.safetensors`` and ``.pt``/``.pth``/``.ckpt``/``.bin`` (a file's format is judged by its first bytes
too: a misnamed one is refused by name), the state dict alone or wrapped as training
scripts save it (``{"state_dict": ..., "epoch": 3, "optimizer_states": ...}``; also under
``model``/``generator``/``generator_ema``/``module``), with or without the ``model.`` (or
``_orig_mod.``) prefix. Loading is strict and checked once, at ``--weights``: missing,
unexpected or wrongly shaped keys, integer tensors, NaN/Inf values and values that overflow
the load dtype (fp16) each fail with the keys as stored in the file.
"""
from __future__ import annotations

from pathlib import Path
import re
from typing import Callable, Mapping

import torch
from torch import nn

from wan_trt.errors import WanTrtError
from wan_trt.log import logger

UPSTREAM_PREFIX = "model."
_STRIPPABLE = ("model.", "_orig_mod.", "module.")
_WRAPPERS = ("state_dict", "model", "generator", "generator_ema", "module")
_SHOW = 12


def read_state_dict(path: str | Path, flag: str = "--weights") -> dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint file (keys as stored); ``flag`` names the file in refusals."""
    path = Path(path)
    if not path.is_file():
        raise WanTrtError(f"{flag} {path}: no such file")
    suffix = path.suffix.lower()
    if suffix not in SAFETENSORS + TORCH_SAVE:
        raise WanTrtError(f"{flag} {path}: expected a {', '.join(SAFETENSORS + TORCH_SAVE)} file")
    if path.stat().st_size == 0:  # the loaders' messages name no cause ("EOFError: ")
        raise WanTrtError(f"{flag} {path}: an empty file (a copy or download that did not finish?); give the whole "
                          "checkpoint")
    kind = _format(path)
    if kind is not None and suffix not in kind:  # misnamed: the other loader's message would mislead
        raise WanTrtError(f"{flag} {path}: a {'safetensors' if kind is SAFETENSORS else 'torch.save'} file named "
                          f"{suffix}; rename it to {kind[0]}")
    try:
        if suffix in SAFETENSORS:
            from safetensors.torch import load_file
            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # corrupt file: the loader's own message says what broke
        raise WanTrtError(f"{flag} {path}: cannot read it ({type(exc).__name__}: {exc})") from None
    return _unwrap(state, path, flag)


SAFETENSORS = (".safetensors",)
TORCH_SAVE = (".pt", ".pth", ".ckpt", ".bin")


def _format(path: Path) -> tuple[str, ...] | None:
    """The suffixes of the format ``path``'s first bytes say it is in, or None where they say neither: a
    safetensors file starts with its header's length (8 bytes, little-endian) and the header's '{'; a torch.save
    file is a zip (or, from before PyTorch 1.6, a pickle: protocol 2 and up start with 0x80)."""
    with path.open("rb") as f:
        head = f.read(9)
    if head[:4] == b"PK\x03\x04" or head[:1] == b"\x80":
        return TORCH_SAVE
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") < path.stat().st_size:
        return SAFETENSORS
    return None


def _unwrap(state: object, path: Path, flag: str) -> dict[str, torch.Tensor]:
    """The state dict itself, or the one a training checkpoint wraps (``{"state_dict": ..., "epoch": 3}``)."""
    if isinstance(state, Mapping) and not _all_tensors(state):
        dicts = [key for key, value in state.items() if _tensor_dict(value)]  # an EMA beside the model too
        inner = [key for key in _WRAPPERS if isinstance(state.get(key), Mapping)]
        several = sorted(set(dicts) | set(inner), key=str)
        if len(several) > 1:
            raise WanTrtError(f"{flag} {path}: holds several state dicts ({', '.join(map(str, several))}); expected "
                              f"one: save the one to use on its own (torch.save(ckpt['{several[0]}'], ...))")
        state = state[inner[0]] if inner else state
    if not isinstance(state, Mapping) or not _all_tensors(state):
        found = ", ".join(f"{k} ({type(v).__name__})" for k, v in list(state.items())[:_SHOW]) \
            if isinstance(state, Mapping) else type(state).__name__
        raise WanTrtError(f"{flag} {path}: expected a state dict of tensors (optionally under "
                          f"'{_WRAPPERS[0]}'), found {found}")
    odd = [k for k in state if not isinstance(k, str)]
    if odd:
        shown = ", ".join(f"{k!r} ({type(k).__name__})" for k in odd[:_SHOW])
        raise WanTrtError(f"{flag} {path}: a state dict's keys are parameter names (strings); found {shown}")
    return dict(state)


def _all_tensors(state: Mapping) -> bool:
    return all(isinstance(v, torch.Tensor) for v in state.values())


def _tensor_dict(value: object) -> bool:
    """A mapping of tensors (a state dict; an optimizer's state holds other values beside its tensors)."""
    return isinstance(value, Mapping) and bool(value) and _all_tensors(value)


def strip_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove ``model.`` / ``_orig_mod.`` / ``module.`` while every key carries it."""
    state = dict(state)
    changed = True
    while changed and state:
        changed = False
        for prefix in _STRIPPABLE:
            if all(k.startswith(prefix) for k in state):
                state = {k[len(prefix):]: v for k, v in state.items()}
                changed = True
    return state


def check_keys(model: nn.Module, state: Mapping[str, torch.Tensor], source: str, flag: str = "--weights",
               hint: str = "pick the --config the checkpoint was trained with (universal, gta_drive, templerun)"
               ) -> None:
    """Raise WanTrtError listing missing, unexpected and wrongly shaped keys."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(f"{k}: checkpoint {tuple(state[k].shape)}, model {expected[k]}"
                   for k in set(expected) & set(state) if tuple(state[k].shape) != expected[k])
    if not (missing or unexpected or wrong):
        return
    lines = [f"{flag} {source} does not match the model:"]
    for title, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
        if items:
            lines.append(f"  {len(items)} {title} key(s): {_listed(items)}")
    lines.append(f"  {_swapped(flag, state) or hint}")
    raise WanTrtError("\n".join(lines))


def _swapped(flag: str, state: Mapping[str, torch.Tensor]) -> str | None:
    """The fix where the file is the other model's checkpoint: a Wan2.1 VAE given as --weights, a DiT as
    --vae-weights (judged by its key names)."""
    vae = sum(k.startswith(("decoder.", "encoder.")) for k in state)
    if flag == "--weights" and vae > len(state) // 2:
        return "it holds a video VAE's keys (decoder.*, encoder.*): pass it with --vae-weights, not --weights"
    if flag == "--vae-weights" and not vae and any("blocks" in k.split(".") for k in state):
        return "it holds a DiT's keys (blocks.*), not a VAE's: pass it with --weights, not --vae-weights"
    return None


def _listed(items: list[str]) -> str:
    more = f", ... ({len(items) - _SHOW} more)" if len(items) > _SHOW else ""
    return ", ".join(items[:_SHOW]) + more


def check_values(state: Mapping[str, torch.Tensor], source: str, dtype: torch.dtype, flag: str = "--weights") -> None:
    """Raise WanTrtError naming (keys as stored) tensors that are not float, hold NaN/Inf, or overflow ``dtype``."""
    kinds = {"FP8-quantized values": _is_fp8,
             "complex numbers": torch.Tensor.is_complex, "booleans": lambda v: v.dtype == torch.bool,
             "integers": lambda v: not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)}
    for what, holds in kinds.items():
        found = [f"{k} ({_name(v.dtype)})" for k, v in state.items() if holds(v)]
        if found:
            raise WanTrtError(f"{flag} {source}: {len(found)} tensor(s) hold {what} where float weights are "
                              f"expected: {_listed(found)}; pass the float (bf16/fp32) checkpoint")
    nonfinite = [f"{k} ({counts})" for k, v in state.items() if (counts := _nonfinite(v))]
    limit = torch.finfo(dtype).max
    peaks = {k: _peak(v, dtype) for k, v in state.items()}  # each tensor read once: a checkpoint may be GBs
    overflow = [f"{k} (max |w| {peak:.3g})" for k, peak in peaks.items() if peak > limit]
    problems = []
    if nonfinite:
        problems.append(f"{len(nonfinite)} tensor(s) hold NaN/Inf: {_listed(nonfinite)}; the file is damaged: "
                        "download or export it again")
    if overflow:
        holds = [name for name, d in (("bf16", torch.bfloat16), ("fp32", torch.float32))
                 if d != dtype and torch.finfo(d).max >= max(peaks.values())]
        fix = f"pass --precision {' or '.join(holds)}" if holds else "no precision holds them: the file is damaged"
        problems.append(f"{len(overflow)} tensor(s) overflow {_name(dtype)} (max {limit:.5g}): "
                        f"{_listed(overflow)}; {fix}")
    if problems:
        raise WanTrtError(f"{flag} {source}: " + "\n  ".join(problems))


def _is_fp8(value: torch.Tensor) -> bool:
    return value.is_floating_point() and value.element_size() == 1


def _nonfinite(value: torch.Tensor) -> str:
    """'' for a finite tensor, else '2 NaN, 1 Inf'."""
    if torch.isfinite(value).all():
        return ""
    counts = ((int(torch.isnan(value).sum()), "NaN"), (int(torch.isinf(value).sum()), "Inf"))
    return ", ".join(f"{n} {what}" for n, what in counts if n)


def _peak(value: torch.Tensor, dtype: torch.dtype) -> float:
    """max |value| when ``dtype`` is narrower than the stored dtype (fp32 -> fp16), else 0."""
    narrower = torch.finfo(value.dtype).max > torch.finfo(dtype).max
    return float(value.abs().max()) if narrower and value.numel() else 0.0


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_checkpoint(model: nn.Module, path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> nn.Module:
    """Load ``path`` strictly into ``model`` (may live on the meta device), converted to ``dtype``.

    Keys, shapes, dtypes and values (NaN/Inf, ``dtype`` overflow) are checked once, here.
    """
    raw = read_state_dict(path)
    state = strip_prefix(raw)
    check_keys(model, state, str(path))
    check_values(raw, str(path), dtype)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    logger.debug("loaded %d tensors from %s", len(state), path)
    return model


# Keys of a whole Wan2.1 VAE file that the decoder does not use (the encoder and its output conv).
VAE_ENCODER_PREFIXES = ("encoder.", "conv1.")


def load_vae_decoder(model: nn.Module, path: str | Path, dtype: torch.dtype = torch.float32,
                     device: str | torch.device = "cpu") -> nn.Module:
    """Load the decoder part (``decoder.*``, ``conv2.*``) of a Wan2.1 VAE checkpoint strictly into ``model``.

    The encoder's keys are skipped; any other key, a missing one or a wrong shape fails, listed.
    """
    return _load_decoder_part(model, path, VAE_ENCODER_PREFIXES, dtype, device, lambda state: (
        _other_width(model, state) or _tiny_decoder_file(state) or "pass the Wan2.1 VAE (Wan2.1_VAE.pth) or its "
        "decoder"))


TINY_ENCODER_PREFIX = "encoder."


def load_tiny_decoder(model: nn.Module, path: str | Path, dtype: torch.dtype = torch.float32,
                      device: str | torch.device = "cpu") -> nn.Module:
    """Load the decoder part (``decoder.*``) of a TAEHV checkpoint for Wan2.1 (``taew2_1.pth``) strictly into
    ``model``. The encoder's keys are skipped; any other key, a missing one or a wrong shape fails, listed."""
    return _load_decoder_part(model, path, (TINY_ENCODER_PREFIX,), dtype, device, lambda state: (
        "the tiny decoder takes TAEHV's checkpoint for Wan2.1's latents (taew2_1.pth); the Wan2.1 VAE "
        "(Wan2.1_VAE.pth) goes with the Wan decoder"))


def _load_decoder_part(model: nn.Module, path: str | Path, skipped: tuple[str, ...], dtype: torch.dtype,
                       device: str | torch.device, hint: Callable[[dict[str, torch.Tensor]], str]) -> nn.Module:
    """The keys of the --vae-weights file ``path`` not starting with ``skipped`` (an autoencoder's encoder), loaded
    strictly into ``model``; refused listing wrong keys, with ``hint(state)`` saying what to pass, or values."""
    state = {k: v for k, v in read_state_dict(path, "--vae-weights").items() if not k.startswith(skipped)}
    check_keys(model, state, str(path), "--vae-weights", hint(state))
    check_values(state, str(path), dtype, "--vae-weights")
    model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in state.items()}, strict=True, assign=True)
    return model


def _tiny_decoder_file(state: Mapping[str, torch.Tensor]) -> str | None:
    """The fix where the file is the tiny decoder's (TAEHV's: decoder.<index>.* keys) given to the Wan decoder."""
    decoder = [k for k in state if k.startswith("decoder.")]
    if decoder and all(re.match(r"decoder\.\d+\.", k) for k in decoder):
        return ("it holds TAEHV's keys (decoder.<index>.*): the tiny decoder's checkpoint (taew2_1.pth); pass it "
                "with `stream --decoder tiny` or `export --graph tiny-decoder`, or pass the Wan2.1 VAE "
                "(Wan2.1_VAE.pth) here")
    return None


def _other_width(model: nn.Module, state: Mapping[str, torch.Tensor]) -> str | None:
    """The fix where the file is a decoder of another width than the config's (a full-size Wan2.1 VAE given
    with a -small config): judged by the first convolution's output channels, 4 x the config's vae_dim."""
    key = "decoder.conv1.bias"
    ours = model.state_dict().get(key)
    theirs = state.get(key)
    if ours is None or theirs is None or theirs.ndim != 1 or theirs.shape == ours.shape:
        return None
    return (f"the file's decoder is {theirs.shape[0] // 4} wide ({key}: {theirs.shape[0]} channels), the config's "
            f"{ours.shape[0] // 4} (inference.vae_dim): pass a config of the file's width (the Wan2.1 VAE's is 96: "
            "the full-size presets)")


def save_checkpoint(model: nn.Module, path: str | Path, prefix: str = UPSTREAM_PREFIX) -> Path:
    """Write ``model``'s weights with upstream key names (``model.`` prefix) as .safetensors or .pt."""
    path = Path(path)
    state = {prefix + k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if path.suffix.lower() == ".safetensors":
        from safetensors.torch import save_file
        save_file(state, str(path))
    else:
        torch.save(state, path)
    return path


def weights_fingerprint(model: nn.Module) -> str:
    """sha256 of every parameter's bytes in state-dict order (what a graph bakes in)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(str(t.dtype).encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()
