"""Host-made feeds staged into one device buffer: the feeds become its views, one load fills them all."""
import pytest
import torch

from wan_trt.engines.runtime.staging import ALIGNMENT, HostStaging
from wan_trt.errors import WanTrtError

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_one_load_fills_every_staged_feed_and_leaves_the_others(device):
    feeds = {"a": torch.zeros(3, 22, device=device), "b": torch.zeros(3, 4, device=device),
             "other": torch.zeros(2, device=device)}
    staging = HostStaging(feeds, ["a", "b"], torch.device(device))
    a, b, other = feeds["a"], feeds["b"], feeds["other"]
    assert a.shape == (3, 22) and b.shape == (3, 4) and a.is_contiguous() and b.is_contiguous()
    base = staging.device_buffer.data_ptr()
    assert (a.data_ptr() - base) % ALIGNMENT == 0 and (b.data_ptr() - base) % ALIGNMENT == 0
    if device == "cuda":  # packed back to back, b started at byte 264: TensorRT needs 256-byte aligned addresses
        assert a.data_ptr() % ALIGNMENT == 0 and b.data_ptr() % ALIGNMENT == 0
    for step in range(3):  # the same views (fixed addresses) refilled, as a CUDA graph needs them
        values = {"a": torch.randn(3, 22), "b": torch.randn(3, 4)}
        staging.load(values)
        assert feeds["a"] is a and feeds["b"] is b
        assert torch.equal(a.cpu(), values["a"]) and torch.equal(b.cpu(), values["b"]), step
    assert torch.equal(other.cpu(), torch.zeros(2))


def test_a_staged_feed_of_another_shape_or_dtype_is_refused():
    feeds = {"a": torch.zeros(3, 22), "b": torch.zeros(3, 4)}
    staging = HostStaging(feeds, ["a", "b"], torch.device("cpu"))
    with pytest.raises(WanTrtError, match=r"staged feeds \['b'\]: expected shapes"):
        staging.load({"a": torch.zeros(3, 22), "b": torch.zeros(4, 3)})
    with pytest.raises(WanTrtError, match="must share one dtype"):
        HostStaging({"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.float64)}, ["a", "b"], torch.device("cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory and asynchronous copies need a CUDA GPU")
def test_a_load_waits_for_the_copy_that_still_reads_the_pinned_buffer():
    """The copy out of pinned memory runs when the stream reaches it: a second load must not rewrite the pinned
    buffer before the first copy has read it (the device is held busy so that the first copy is still queued)."""
    feeds = {"a": torch.zeros(64, device="cuda")}
    staging = HostStaging(feeds, ["a"], torch.device("cuda"))
    first, second = torch.full((64,), 1.0), torch.full((64,), 2.0)
    torch.cuda._sleep(200_000_000)  # about 0.1 s of device time queued before the first copy
    staging.load({"a": first})
    seen = feeds["a"].clone()  # queued after the first copy: what it wrote
    staging.load({"a": second})
    torch.cuda.synchronize()
    assert torch.equal(seen.cpu(), first) and torch.equal(feeds["a"].cpu(), second)
