"""Frames out: decoded RGB as uint8 and an H.264 MP4 file (PyAV, no system ffmpeg needed)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

FPS = 25  # Matrix-Game 2.0 streams at 25 video frames per second


def to_uint8_frames(rgb: torch.Tensor) -> torch.Tensor:
    """Decoder output [1, 3, T, H, W] in [-1, 1] -> uint8 [T, H, W, 3] (on the same device)."""
    return ((rgb[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(1, 2, 3, 0).contiguous()


def write_mp4(frames: torch.Tensor | Sequence[torch.Tensor], path: str | Path, fps: int = FPS) -> Path:
    """Write uint8 frames [N, H, W, 3], or blocks of them in order, as H.264 (yuv420p; odd sizes are padded by one
    pixel). Frames are read one at a time: a stream's video is never copied whole (at full size it is the largest
    thing a long stream holds)."""
    import av  # deferred: only writing and reading files needs PyAV, not the runtimes that make frames

    path = Path(path)
    blocks = [frames] if isinstance(frames, torch.Tensor) else list(frames)
    _, h, w, _ = blocks[0].shape
    with av.open(str(path), mode="w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width, stream.pix_fmt = h + h % 2, w + w % 2, "yuv420p"  # H.264 needs even sizes
        for block in blocks:
            for frame in block:
                frame = frame.cpu().numpy()
                if h % 2 or w % 2:
                    frame = np.pad(frame, ((0, h % 2), (0, w % 2), (0, 0)))
                container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())
    return path


def count_frames(path: str | Path) -> int:
    """Video frames in a file (decoded, not from the header)."""
    import av  # deferred, as in write_mp4

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))
