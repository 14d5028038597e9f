"""Loading and writing checkpoints with upstream key names.

Upstream files (``base_distill.safetensors`` ...) hold the CausalWanModel state dict
with keys prefixed ``model.`` (the diffusion wrapper's attribute). Accepted here:
``.safetensors`` and ``.pt``/``.pth`` (optionally wrapped in ``{"state_dict": ...}``),
with or without the ``model.`` (or ``_orig_mod.``) prefix. Loading is strict: any
missing, unexpected or wrongly shaped key fails with the list of them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import torch
from torch import nn

from wan_trt.errors import WanTrtError
from wan_trt.log import logger

UPSTREAM_PREFIX = "model."
_STRIPPABLE = ("model.", "_orig_mod.", "module.")
_WRAPPERS = ("state_dict", "model", "generator", "module")
_SHOW = 12


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The raw tensors of a checkpoint file (keys as stored)."""
    path = Path(path)
    if not path.is_file():
        raise WanTrtError(f"--weights {path}: no such file")
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file
            state = load_file(str(path))
        elif suffix in (".pt", ".pth", ".bin", ".ckpt"):
            state = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise WanTrtError(f"--weights {path}: expected a .safetensors, .pt or .pth file")
    except WanTrtError:
        raise
    except Exception as exc:  # corrupt file: the loader's own message says what broke
        raise WanTrtError(f"--weights {path}: cannot read it ({type(exc).__name__}: {exc})") from None
    return _unwrap(state, path)


def _unwrap(state: object, path: Path) -> dict[str, torch.Tensor]:
    if isinstance(state, Mapping):
        for key in _WRAPPERS:
            inner = state.get(key)
            if isinstance(inner, Mapping) and len(state) <= 3:
                state = inner
                break
    if not isinstance(state, Mapping) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise WanTrtError(f"--weights {path}: expected a state dict of tensors")
    return dict(state)


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


def check_keys(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Raise WanTrtError listing missing, unexpected and wrongly shaped keys."""
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(f"{k}: checkpoint {tuple(state[k].shape)}, model {expected[k]}"
                   for k in set(expected) & set(state) if tuple(state[k].shape) != expected[k])
    if not (missing or unexpected or wrong):
        return
    lines = [f"--weights {source} does not match the config:"]
    for title, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong)):
        if items:
            shown = ", ".join(items[:_SHOW]) + (f", ... ({len(items) - _SHOW} more)" if len(items) > _SHOW else "")
            lines.append(f"  {len(items)} {title} key(s): {shown}")
    lines.append("  pick the --config the checkpoint was trained with (universal, gta_drive, templerun)")
    raise WanTrtError("\n".join(lines))


def load_checkpoint(model: nn.Module, path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str | torch.device = "cpu") -> nn.Module:
    """Load ``path`` strictly into ``model`` (may live on the meta device), converted to ``dtype``."""
    state = strip_prefix(read_state_dict(path))
    check_keys(model, state, str(path))
    state = {k: v.to(device=device, dtype=dtype if v.is_floating_point() else v.dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    logger.debug("loaded %d tensors from %s", len(state), path)
    return model


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
