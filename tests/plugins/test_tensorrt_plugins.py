"""The TensorRT plugins: their AOT kernel plans (compiled to PTX here, no GPU needed) and, where
TensorRT exists, registration and an engine build that uses them."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from wan_trt.config import load_config
from wan_trt.export.transformer import export_transformer
from wan_trt.plugins.tensorrt_plugins import ATTENTION_TACTICS
from tests.plugins.test_ops import PLUGIN_OPS

HAS_TRT = importlib.util.find_spec("tensorrt") is not None
ROOT = Path(__file__).resolve().parents[2]


def ptx_facts() -> None:
    """Run in a child process: print what the sm_90 PTX of every plan contains, as JSON."""
    from wan_trt.plugins.tensorrt_plugins import adaln_plan, attention_plan, qk_norm_rope_plan
    facts = {}
    for tactic in range(len(ATTENTION_TACTICS)):
        compiled, grid, scalars = attention_plan((1, 2640, 12, 128), 2640, torch.bfloat16, 3, 880, tactic, arch=90)
        facts[f"attention{tactic}"] = {"ptx": [s in compiled.ptx for s in (".entry", "cp.async", "wgmma.mma_async")],
                                       "grid": list(grid), "scalars": len(scalars)}
    qk = qk_norm_rope_plan((1, 2640, 1536), torch.bfloat16, 64, 1e-6, arch=90)[0].ptx
    fused = adaln_plan((1, 2640, 1536), torch.bfloat16, torch.bfloat16, (1, 3, 1, 1536), 3, 1e-6, fused=True,
                       arch=90)[0].ptx
    facts["norms"] = [s in ptx for ptx in (qk, fused) for s in (".entry", "ld.global.v4")]
    print(json.dumps(facts))


def test_aot_kernels_compile_to_ptx():
    """The TensorRT AOT plans compile for an H100 (sm_90) with no GPU here: every attention tactic, with
    its K/V loads pipelined through cp.async (the plans pass the 16-divisibility the JIT launcher would)
    and its dots on wgmma; the norm kernels with 16-byte vector loads. In a child process, because
    under TRITON_INTERPRET the kernels cannot be compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from tests.plugins.test_tensorrt_plugins import ptx_facts; ptx_facts()"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    facts = json.loads(run.stdout.strip().splitlines()[-1])
    for i, tiling in enumerate(ATTENTION_TACTICS):
        grid = [(2640 + tiling.block_m - 1) // tiling.block_m, 12]
        assert facts[f"attention{i}"] == {"ptx": [True, True, True], "grid": grid, "scalars": 18}, f"tactic {i}"
    assert all(facts["norms"]), facts["norms"]


def test_plans_refuse_arguments_out_of_kernel_order():
    """TensorRT passes the scalars by position: a plan whose argument list drifts from the kernel's
    parameters must fail at build time, not run with shuffled values."""
    from wan_trt.errors import WanTrtError
    from wan_trt.plugins import qk_norm_rope as qk
    from wan_trt.plugins.tensorrt_plugins import compile_ptx
    scalars = {"C": 1536, "L": 2640, "HALF_D": 64, "stride_row": 1536, "stride_out_row": 1536}  # L and C swapped
    with pytest.raises(WanTrtError, match="in order"):
        compile_ptx(qk._qk_norm_rope_kernel, {"Q": torch.bfloat16, "K": torch.bfloat16, "WQ": torch.bfloat16,
                                              "WK": torch.bfloat16, "COS": torch.float32, "SIN": torch.float32},
                    scalars, {"QO": torch.bfloat16, "KO": torch.bfloat16}, {"eps": 1e-6, "BLOCK_PAIRS": 1024},
                    4, 1, arch=90)


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed: pip install tensorrt (10.9+; NVIDIA package index, CUDA GPU)")
def test_tensorrt_plugins_register_and_build(tmp_path):
    import tensorrt.plugin as trtp
    from wan_trt.engines.tensorrt import build_tensorrt, inspect_tensorrt
    from wan_trt.plugins.tensorrt_plugins import register_plugins
    register_plugins()
    for op in PLUGIN_OPS:
        assert getattr(trtp.op.wan_trt, op.split("::")[1]) is not None
    export_transformer(load_config("universal-small"), tmp_path / "p", "bf16", seed=1, ops="plugins")
    engine = build_tensorrt(tmp_path / "p")
    assert inspect_tensorrt(engine)["counts"]["plugin_layers"] >= 4 * 5
