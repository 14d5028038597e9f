"""Host-made feeds reaching the device in one asynchronous copy.

A block's rotary tables are formed on the host (float64 math, see :mod:`wan_trt.rotary`). Copied one
by one from pageable memory, each copy held the host until the driver had staged it, and at a block's
start the device waits on the host (H200 timeline, ``scripts/block_kernels.py``: gaps of 0.13-0.24 ms
around those copies). Here the feeds are views of one device buffer, filled from one pinned host buffer
by one copy that does not hold the host. Each view starts on a 256-byte boundary: TensorRT requires that
of every tensor address, the fused kernels are compiled for 16-byte aligned pointers, and an AOTInductor
engine copies an input that is not aligned as it assumed before every call.
"""
from __future__ import annotations

import torch

from wan_trt.errors import WanTrtError

ALIGNMENT = 256  # bytes, of every staged feed's address (TensorRT's requirement of tensor addresses)


class HostStaging:
    """The feeds ``names`` of ``feeds`` (replaced in place by views of one device buffer of their dtype, each
    aligned to :data:`ALIGNMENT` bytes); :meth:`load` copies new values into all of them at once, in stream
    order."""

    def __init__(self, feeds: dict[str, torch.Tensor], names: list[str], device: torch.device):
        dtypes = {feeds[n].dtype for n in names}
        if len(dtypes) != 1:
            raise WanTrtError(f"staged feeds {names} must share one dtype, got {sorted(map(str, dtypes))}")
        dtype = dtypes.pop()
        step = ALIGNMENT // dtype.itemsize  # elements from one aligned start to the next
        offsets, end = [], 0
        for name in names:
            offsets.append(end)
            end += -(-feeds[name].numel() // step) * step
        self.device = device
        self.cuda = device.type == "cuda"
        self.device_buffer = torch.zeros(end, dtype=dtype, device=device)  # CUDA allocations start 256-byte aligned
        self.host_buffer = torch.zeros(end, dtype=dtype, pin_memory=self.cuda)

        def views(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
            return {n: buffer[o:o + feeds[n].numel()].view(feeds[n].shape) for n, o in zip(names, offsets)}
        self.host_views = views(self.host_buffer)  # made once: the feeds' slots in the pinned buffer
        feeds.update(views(self.device_buffer))
        self.copied: torch.cuda.Event | None = None  # the last copy out of the pinned buffer

    def load(self, values: dict[str, torch.Tensor]) -> None:
        """Copy ``values`` (host tensors of the feeds' shapes) into the feeds: one copy, queued on the
        current stream, and the host goes on at once. The pinned buffer is rewritten only once the copy
        that read it last has run."""
        wrong = [n for n, view in self.host_views.items() if values[n].shape != view.shape]
        if wrong:
            shapes = [list(view.shape) for view in self.host_views.values()]
            raise WanTrtError(f"staged feeds {wrong}: expected shapes {shapes}")
        if self.copied is not None and not self.copied.query():  # long done at a block's start
            self.copied.synchronize()
        for name, view in self.host_views.items():
            view.copy_(values[name])
        self.device_buffer.copy_(self.host_buffer, non_blocking=self.cuda)
        if self.cuda:
            self.copied = torch.cuda.Event()
            self.copied.record(torch.cuda.current_stream(self.device))
