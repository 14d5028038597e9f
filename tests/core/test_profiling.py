"""Kernel names from real profiles land in the op class the bench reports them under."""
import pytest

from wan_trt.profiling import classify


@pytest.mark.parametrize("kernel, expected", [
    ("_window_attention_kernel", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_cga1x1x1_kernel0_0",
     "attention"),
    ("nvjet_sm90_tst_128x240_64x4_2x1_v_bz_coopA_bias_TNT", "gemm"),
    ("_qk_norm_rope_kernel", "norm"),
    ("_adaln_kernel", "norm"),
    ("_add_adaln_kernel", "norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>", "norm"),
    ("triton_poi_fused_gelu_view_35", "elementwise"),
    ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::OpaqueType<2u>>", "copy/cat"),
])
def test_kernel_classes(kernel, expected):
    assert classify(kernel) == expected
