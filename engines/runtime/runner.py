"""The one interface every backend implements (Polygraphy style).

    with runner:
        outputs = runner.infer(feeds)   # dict name -> device tensor, per the spec

``feeds`` hold every spec input on ``runner.device``, contiguous (:meth:`Runner.check_feeds` says which one is
not); outputs hold every spec output.
Outputs may be fresh tensors (torch, AOTInductor) or the runner's own bound buffers;
a runner that owns its output buffers says so with ``owns_outputs`` and accepts new
ones through :meth:`rebind_output`, so a session can swap caches instead of copying.
A runner that needs fixed input addresses (CUDA graphs) sets ``swap_inputs = False``
and the session commits caches by copy into the same buffers; one whose outputs also keep
their addresses from call to call sets ``fixed_buffers``, and the session captures its own
per-block work over them as CUDA graphs too.
"""
from __future__ import annotations

import abc
from typing import ContextManager

import torch

from wan_trt.engines.runtime.arithmetic import computed_as
from wan_trt.errors import WanTrtError
from wan_trt.spec import PassSpec


def checked_tensor(name: str, value: object, shape: tuple[int, ...], what: str, numbers: bool = False) -> torch.Tensor:
    """``value`` refused unless it is a dense tensor with values (not on the meta device, not sparse) of ``shape`` and
    a floating dtype (``numbers``: any real one, as actions given as 0/1 integers or booleans); ``what`` it is for, in
    messages. A sparse or meta tensor had ended in torch's error where it was copied in; an integer or boolean image
    feature was converted without a word."""
    if not isinstance(value, torch.Tensor):
        raise WanTrtError(f"{name}: expected a torch.Tensor for {what}, got {type(value).__name__}")
    if value.layout != torch.strided or value.is_meta:
        kind = "a meta tensor (no values)" if value.is_meta else f"a {value.layout} tensor"
        raise WanTrtError(f"{name}: expected a dense tensor with values for {what}, got {kind}")
    if value.is_complex():
        raise WanTrtError(f"{name}: expected a real tensor for {what}, got {value.dtype}")
    if not (value.is_floating_point() or numbers):
        raise WanTrtError(f"{name}: expected a floating-point tensor for {what}, got {value.dtype}")
    if tuple(value.shape) != tuple(shape):
        raise WanTrtError(f"{name}: expected shape {list(shape)} for {what}, got {list(value.shape)}")
    return value


def check_device(device: str) -> torch.device:
    """The torch device ``device`` names, if this machine has it (cpu, cuda, cuda:N)."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise WanTrtError(f"--device {device!r} is not a torch device; pass cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise WanTrtError(f"--device {device}: wan-trt runs on cpu or cuda (cuda:N), not '{dev.type}'")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            built = "" if torch.version.cuda else f" (torch {torch.__version__} is built without CUDA)"
            raise WanTrtError(f"--device {device}: no CUDA GPU is visible on this machine{built}; pass --device cpu")
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise WanTrtError(f"--device {device}: no CUDA device cuda:{dev.index} (this machine has {count}); "
                              f"pass --device cuda:0 .. cuda:{count - 1}")
    return dev


def concrete_device(device: str) -> str:
    """``device`` with the index a runner of it uses: 'cuda' is the current GPU ('cuda:0' unless set); 'cpu'."""
    kind, _, index = str(device).partition(":")
    if kind != "cuda" or index:
        return f"{kind}:{int(index)}" if index else kind
    return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cuda:0"


class Runner(abc.ABC):
    """Base class: ``activate``/``deactivate`` around ``infer``; usable as a context manager."""

    name: str = "runner"
    owns_outputs: bool = False  # outputs are the runner's own buffers (see rebind_output)
    swap_inputs: bool = True  # the session may hand new tensors as inputs (cache swap); else it copies
    fixed_buffers: bool = False  # inputs must keep, and outputs keep, their addresses (CUDA graphs)
    needs_activation: bool = True  # infer only inside `with runner:` (activate loads what it runs)
    strided_feeds: bool = False  # infer reads inputs of any layout; else they must be contiguous
    without_cuda: str = "run on cpu (--device cpu / --provider cpu)"  # what to do where a CUDA run cannot be
    weights_sha256: str | None = None  # of the weights it runs, where known (an export's or engine's manifest)

    def __init__(self, spec: PassSpec, device: str | torch.device):
        self.spec = spec
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise WanTrtError(f"{type(self).__name__} runs on {self.device}, and this machine has no CUDA device "
                              f"that PyTorch can use; {self.without_cuda}")
        self.device = torch.device(concrete_device(str(self.device)))  # "cuda" -> "cuda:N": comparable to tensors'
        self.is_active = False

    def __enter__(self) -> "Runner":
        if not self.is_active:
            self.activate()
            self.is_active = True
        return self

    def __exit__(self, *exc) -> None:
        if self.is_active:
            self.deactivate()
            self.is_active = False

    def activate(self) -> None:
        """Load / compile what ``infer`` needs. Defaults to nothing."""

    def deactivate(self) -> None:
        """Free what ``activate`` loaded. Defaults to nothing."""

    @abc.abstractmethod
    def infer(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Run one pass."""

    def check_feeds(self, feeds: dict[str, torch.Tensor]) -> None:
        """Refuse a call outside ``with runner:`` (where ``activate`` loads what runs) and feeds that are not the
        spec's inputs as this runner reads them: torch tensors of the spec's names, shapes and dtypes, on its device,
        contiguous unless it reads any layout. An engine takes its inputs by address, in the layout it was built for:
        a feed of another device crashed the process, a strided one ran with wrong outputs."""
        if self.needs_activation and not self.is_active:
            raise WanTrtError(f"{self.name}: infer() outside `with runner:`, which loads what it runs (and releases "
                              "it on exit); call it inside the `with` block")
        self.spec.check_feeds(feeds)
        problems = []
        for name in self.spec.input_names:
            value = feeds[name]
            if value.device != self.device:
                problems.append(f"input '{name}' is on {value.device}, not {self.device}")
            elif not (self.strided_feeds or value.is_contiguous()):
                problems.append(f"input '{name}' is not contiguous (pass .contiguous())")
        if problems:
            raise WanTrtError(f"feeds of {self.name}: " + "; ".join(problems))

    def arithmetic(self) -> ContextManager[None]:
        """The setting this runner's graph computes under (:func:`~wan_trt.engines.runtime.arithmetic.computed_as`):
        an fp32 graph in IEEE fp32, not TF32, wherever it runs (a check, a stream, a bench), so what is timed and
        streamed computes as what was checked. Runners whose own library computes through PyTorch's convolutions and
        matmuls (AOTInductor, torch) enter it around every call; ONNX Runtime and TensorRT have their own switches
        (``use_tf32``, the TF32 builder flag)."""
        return computed_as(self.spec.dtype)

    def rebind_output(self, name: str, tensor: torch.Tensor) -> None:
        """Give an owned output a new buffer (only for runners with ``owns_outputs``)."""
        raise NotImplementedError(f"{self.name} returns fresh outputs")
