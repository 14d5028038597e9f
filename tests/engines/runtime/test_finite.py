"""The session's non-finite check: which tensor first holds NaN or Inf, on every device at hand."""
import pytest
import torch

from wan_trt.engines.runtime.finite import first_non_finite

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_first_non_finite_names_the_first_bad_tensor(device, dtype, bad):
    gen = torch.Generator().manual_seed(0)
    tensors = {f"t{i:03d}": torch.randn(3, 1000 + i, generator=gen).to(device, dtype) for i in range(130)}
    tensors["t120"] = torch.randn(3, 100_000, generator=gen).to(device, dtype)  # several chunks of 65536
    assert first_non_finite(tensors) is None
    tensors["t120"][2, -1] = bad  # in its last chunk, in a tensor past the first launch's
    assert first_non_finite(tensors) == "t120"
    tensors["t077"].view(-1)[1234] = bad
    tensors["t101"][2, -1] = bad
    assert first_non_finite(tensors) == "t077"
    tensors["t003"][0, 0] = bad
    assert first_non_finite(tensors) == "t003"


@pytest.mark.parametrize("device", DEVICES)
def test_first_non_finite_takes_empty_mixed_and_huge_finite_tensors(device):
    big = torch.finfo(torch.float32).max
    tensors = {"empty": torch.empty(0, device=device), "half": torch.ones(4, device=device, dtype=torch.float16),
               "huge": torch.full((8,), big, device=device),  # finite, however large
               "ints": torch.arange(5, device=device), "flags": torch.ones(3, dtype=torch.bool, device=device)}
    assert first_non_finite(tensors) is None
    assert first_non_finite({}) is None
    tensors["half"][1] = float("nan")
    assert first_non_finite(tensors) == "half"


def test_float64_and_complex_tensors_are_judged_in_their_own_dtype():
    """The check reduced every tensor to fp32: float64 and complex tensors crashed it, and a finite float64
    beyond fp32's range would have read as Inf."""
    from wan_trt.engines.runtime.finite import first_non_finite
    finite = {"big": torch.full((3,), 1e300, dtype=torch.float64), "z": torch.tensor([1 + 1j, 2 - 1j]),
              "x": torch.ones(2, dtype=torch.bfloat16)}
    assert first_non_finite(finite) is None
    assert first_non_finite({**finite, "bad": torch.tensor([1.0, float("nan")], dtype=torch.float64)}) == "bad"
    assert first_non_finite({**finite, "inf": torch.tensor([complex(float("inf"), 0.0)])}) == "inf"
