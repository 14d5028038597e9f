"""scripts/conv_tiles.py: the decoder's convolutions it measures, and its CUTLASS kernels compile."""
import importlib.util
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def conv_tiles():
    spec = importlib.util.spec_from_file_location("conv_tiles", ROOT / "scripts" / "conv_tiles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_measures_each_distinct_convolution_of_a_steady_block_once():
    groups = conv_tiles().distinct_convolutions("universal")
    listed = {(c.in_channels, c.out_channels, c.kernel, c.frames, c.height, c.width): len(paths)
              for c, paths in groups}
    assert listed[(96, 96, (3, 3, 3), 12, 352, 640)] == 6  # the full resolution: 96 outputs, cuDNN computes 128
    assert listed[(192, 192, (3, 3, 3), 12, 176, 320)] == 6  # a quarter of it: 192, cuDNN computes 128 + 64
    assert listed[(384, 768, (3, 1, 1), 6, 88, 160)] == 1  # a temporal upsampling
    assert all(c.out_channels >= 8 and c.kernel[0] == 3 for c, _ in groups)  # no head, no 1x1x1
    paths = [p for _, ps in groups for p in ps]
    assert len(paths) == len(set(paths)) == 31  # 32 causal convolutions with a history, less the head's


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None or importlib.util.find_spec("cutlass_library") is None,
                    reason="needs nvcc (CUDA 12+) and nvidia-cutlass's headers")
def test_the_cutlass_kernels_compile_for_hopper(tmp_path):
    module = conv_tiles()
    lib = module.build(tmp_path)
    assert lib.is_file() and module.build(tmp_path) == lib  # the second call reuses it
    symbols = lib.read_bytes()
    for tile in module.TILES:
        assert module.tile_name(tile).encode() in symbols
