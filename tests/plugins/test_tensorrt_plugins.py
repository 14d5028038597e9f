"""The TensorRT plugins: their AOT kernel plans (compiled to PTX here, no GPU needed) and, where
TensorRT exists, registration and an engine build that uses them."""
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch

from wan_trt.config_load import load_config
from wan_trt.export.transformer import export_transformer
from wan_trt.plugins.launch import GPU_TILINGS
from wan_trt.plugins.registry import FUSED_OPS, fused_op

HAS_TRT = importlib.util.find_spec("tensorrt") is not None
ROOT = Path(__file__).resolve().parents[2]


def plan_examples() -> dict:
    """op name -> the arguments of its plan at the universal model's sizes (bf16, 3 latent frames)."""
    from wan_trt.plugins.aot import TensorArg
    bf16 = torch.bfloat16
    qkv, x, w = TensorArg((1, 2640, 12, 128), bf16), TensorArg((1, 2640, 1536), bf16), TensorArg((1536,), bf16)
    table, mod = TensorArg((2640, 64), torch.float32), TensorArg((1, 3, 1, 1536), bf16)
    few = TensorArg((880, 3, 16, 64), bf16)  # the mouse path's queries and keys: per token, 3 frames
    frames = TensorArg((3, 32), torch.float32)  # the keyboard queries' rotation: per frame, heads of 64
    return {"window_attention": (qkv, qkv, qkv, qkv, qkv, TensorArg((1,), torch.int32), 3, 880),
            "few_key_attention": (few, few, few, few, few, TensorArg((1,), torch.int32), 3, 1),
            "qk_norm_rope": (x, x, w, w, table, table, 1e-6, 1536),
            "norm_rope": (TensorArg((1, 2640, 1024), bf16), TensorArg((1024,), bf16), frames, frames, 1e-6, 64),
            "adaln": (x, mod, mod, 3, 1e-6), "add_adaln": (x, x, mod, mod, mod, 3, 1e-6),
            **decoder_norm_examples()}


def decoder_norm_examples() -> dict:
    """The decoder's full-resolution norm (bf16): a 96-channel convolution computed as 128; and the quarter
    resolution's: a 192-channel one computed as 128 + 64."""
    from wan_trt.plugins.aot import TensorArg
    bf16 = torch.bfloat16
    x, bias, r = TensorArg((1, 128, 12, 352, 640), bf16), TensorArg((128,), bf16), TensorArg((1, 96, 12, 352, 640), bf16)
    gamma, history = TensorArg((96,), bf16), TensorArg((1, 96, 2, 352, 640), bf16)
    x2, tail, bias2 = TensorArg((1, 128, 12, 176, 320), bf16), TensorArg((1, 64, 12, 176, 320), bf16), TensorArg((192,), bf16)
    r2, gamma2, history2 = (TensorArg((1, 192, 12, 176, 320), bf16), TensorArg((192,), bf16),
                            TensorArg((1, 192, 2, 176, 320), bf16))
    return {"norm_silu_join": (x, bias, gamma, history), "add_norm_silu_join": (x, bias, r, gamma, history),
            "split_norm_silu_join": (x2, tail, bias2, gamma2, history2),
            "split_add_norm_silu_join": (x2, tail, bias2, r2, gamma2, history2)}


def ptx_facts() -> None:
    """Run in a child process: print what the sm_90 PTX of every registered op's plans contains, as JSON."""
    examples, facts = plan_examples(), {}
    for op in FUSED_OPS:
        for tactic in range(max(1, len(op.tactics))):
            compiled, grid, scalars = op.plan(*examples[op.name], tactic=tactic, arch=90)
            found = {s: s in compiled.ptx for s in (".entry", "cp.async", "wgmma.mma_async", "ld.global.v4")}
            facts[f"{op.name}{tactic}"] = {"ptx": found, "grid": list(grid), "scalars": len(scalars)}
    print(json.dumps(facts))


def test_aot_kernels_compile_to_ptx():
    """The TensorRT AOT plans of every registered op compile for an H100 (sm_90) with no GPU here: every
    attention tactic, with its K/V loads pipelined through cp.async (the plans pass the 16-divisibility
    the JIT launcher would) and its dots on wgmma; the norm kernels with 16-byte vector loads. In a child
    process, because under TRITON_INTERPRET the kernels cannot be compiled."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = "from tests.plugins.test_tensorrt_plugins import ptx_facts; ptx_facts()"
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    facts = json.loads(run.stdout.strip().splitlines()[-1])
    assert set(facts) == {f"{op.name}{t}" for op in FUSED_OPS for t in range(max(1, len(op.tactics)))}
    for i, tiling in enumerate(GPU_TILINGS):
        grid = [(2640 + tiling.block_m - 1) // tiling.block_m, 12]
        fact = facts[f"window_attention{i}"]
        assert fact["grid"] == grid and fact["scalars"] == 18, f"tactic {i}: {fact}"
        assert fact["ptx"][".entry"] and fact["ptx"]["cp.async"] and fact["ptx"]["wgmma.mma_async"], f"tactic {i}"
    for name in ("qk_norm_rope0", "norm_rope0", "adaln0", "add_adaln0", "norm_silu_join0", "add_norm_silu_join0",
                 "split_norm_silu_join0", "split_add_norm_silu_join0"):
        assert facts[name]["ptx"][".entry"] and facts[name]["ptx"]["ld.global.v4"], (name, facts[name])


def test_plans_refuse_arguments_out_of_kernel_order():
    """TensorRT passes the scalars by position: a plan whose argument list drifts from the kernel's
    parameters must fail at build time, not run with shuffled values."""
    from wan_trt.errors import WanTrtError
    from wan_trt.plugins.aot import compile_ptx
    from wan_trt.plugins.qk_norm_rope import group_launch
    scalars = {"C": 1536, "L": 2640, "HALF_D": 64, "GROUP": 1536, "stride_row": 1536, "stride_out_row": 1536}  # L, C swapped
    with pytest.raises(WanTrtError, match="in order"):
        compile_ptx(fused_op("qk_norm_rope").kernel,
                    {"Q": torch.bfloat16, "K": torch.bfloat16, "WQ": torch.bfloat16, "WK": torch.bfloat16,
                     "COS": torch.float32, "SIN": torch.float32},
                    scalars, {"QO": torch.bfloat16, "KO": torch.bfloat16}, {"eps": 1e-6},
                    group_launch(1536, 64, 1536), arch=90)


def test_autotune_functions_have_a_signature_tensorrt_plugin_takes():
    """tensorrt.plugin.autotune checks a given return annotation: AutoTuneCombination or List[AutoTuneCombination]
    (tensorrt/plugin/_validate.py, _validate_autotune). The autotune functions were annotated with a bare ``list``,
    which it refuses (ValueError), so registering the plugins failed for every op with tactics or formats."""
    from wan_trt.plugins.tensorrt_plugins import tune_signature
    for op in FUSED_OPS:
        signature = tune_signature(op)
        assert list(signature.parameters) == [i.name for i in op.inputs] + ["outputs"], op.name
        annotation = signature.return_annotation
        assert annotation is inspect.Signature.empty or typing.get_origin(annotation) is list, (op.name, annotation)


def test_tensorrt_tactics_are_non_zero_and_name_every_tiling():
    """A plugin's custom tactics must be unique and non-zero: 0 is TensorRT's default tactic of each format
    combination (NvInferRuntime.h, IPluginV3OneBuild::getValidTactics). Window attention advertised its tilings as
    0..n-1; now tiling i is tactic i + 1, and the default tactic runs the first tiling."""
    from wan_trt.plugins.tensorrt_plugins import tiling_of, trt_tactics
    op = fused_op("window_attention")
    tactics = trt_tactics(op)
    assert 0 not in tactics and len(set(tactics)) == len(tactics) == len(op.tactics)
    assert [tiling_of(t) for t in tactics] == list(range(len(op.tactics))) and tiling_of(0) == 0
    assert all(trt_tactics(o) is None for o in FUSED_OPS if not o.tactics)


TRT_NAMES = {1: "FP32", 10: "FP16", 16: "BF16", 6: "INT32"}  # ONNX TensorProto data types


def type_lists(combination: str) -> list[list[str]]:
    """The type combinations of an AutoTuneCombination's types, as TensorRT's documentation of it reads: positions
    listing types with '|' take the k-th type together; a single type is every combination's."""
    positions = [part.strip().split("|") for part in combination.split(",")]
    width = max(len(types) for types in positions)
    assert all(len(types) in (1, width) for types in positions), positions
    return [[types[k] if len(types) > 1 else types[0] for types in positions] for k in range(width)]


def autotune_combinations(op, ranks) -> list[list[str]]:
    """Every type combination of every AutoTuneCombination of ``op`` (I/O of ``ranks``)."""
    from wan_trt.plugins.tensorrt_plugins import tune_combinations
    return [types for combination, _ in tune_combinations(op, ranks) for types in type_lists(combination)]


def test_channels_last_ops_list_tensorrts_channels_last_format_of_each_type():
    """TensorRT's DHWC format is FP32's only (its documentation: 'requires FP32'); the bf16 and fp16 channels-last
    format is DHWC8. The channels-last ops listed DHWC for bf16, fp16 and fp32 alike: no bf16 or fp16 implementation
    TensorRT could pick. Each 5-D tensor now takes the format of its type."""
    from wan_trt.plugins.tensorrt_plugins import tune_combinations
    ops = [op for op in FUSED_OPS if op.channels_last]
    assert ops
    for op in ops:
        ranks = [5] * (len(op.inputs) + len(op.outputs))
        for combination, formats in tune_combinations(op, ranks):
            floats = {t for types in type_lists(combination) for t in types} - {"INT32"}
            want = "DHWC" if floats == {"FP32"} else "DHWC8"
            assert floats and (floats == {"FP32"} or not floats & {"FP32"}), combination
            assert formats.split(", ") == [want] * len(ranks), (op.name, combination, formats)
        assert {t for c, _ in tune_combinations(op, ranks) for ts in type_lists(c) for t in ts} >= {"BF16", "FP16",
                                                                                                   "FP32"}


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp32"])
def test_autotune_types_cover_the_exported_nodes(tmp_path, precision):
    """An op with an autotune function runs only in the type combinations it lists; a strongly typed network gives
    it the graph's types. The combinations listed bf16 and fp16 only, so an fp32 graph's WindowAttention had none
    TensorRT could pick. Every exported node of such an op is now one of its combinations."""
    import onnx
    export_transformer(load_config("universal-small"), tmp_path / "g", precision, seed=1, ops="plugins")
    model = onnx.shape_inference.infer_shapes(onnx.load(str(tmp_path / "g" / "model.onnx"), load_external_data=False))
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]}
    shapes = {v.name: v.type.tensor_type.shape.dim for v in [*graph.value_info, *graph.input, *graph.output]}
    shapes.update({t.name: t.dims for t in graph.initializer})
    types.update({t.name: t.data_type for t in graph.initializer})
    checked = 0
    for node in graph.node:
        op = fused_op(node.op_type) if node.domain == "wan_trt" else None
        if op is None or not (op.tactics or op.channels_last):
            continue
        node_types = [TRT_NAMES[types[name]] for name in [*node.input, *node.output]]
        ranks = [len(shapes[name]) for name in [*node.input, *node.output]]
        assert node_types in autotune_combinations(op, ranks), (node.name, node_types, autotune_combinations(op, ranks))
        checked += 1
    assert checked > 0


@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TRT, reason="TensorRT is not installed: pip install tensorrt (10.9+; NVIDIA package index, CUDA GPU)")
def test_tensorrt_plugins_register_and_build(tmp_path):
    import tensorrt.plugin as trtp
    from wan_trt.engines.backends.tensorrt import build_tensorrt, inspect_tensorrt
    from wan_trt.plugins.tensorrt_plugins import register_plugins
    register_plugins()
    for op in FUSED_OPS:
        assert getattr(trtp.op.wan_trt, op.op_type) is not None
    export_transformer(load_config("universal-small"), tmp_path / "p", "bf16", seed=1, ops="plugins")
    engine = build_tensorrt(tmp_path / "p")
    assert inspect_tensorrt(engine)["counts"]["plugin_layers"] >= 4 * 5


def test_a_channels_last_plugin_refuses_channels_that_dhwc8_would_pad():
    """TensorRT hands a bf16 or fp16 channels-last tensor over as DHWC8 (channels padded to 8); the fused kernels read
    channels dense, so channels that are no multiple of 8 are refused when the plugin is planned (fp32's DHWC is
    dense: taken)."""
    import torch

    from wan_trt.errors import WanTrtError
    from wan_trt.plugins.aot import TensorArg
    from wan_trt.plugins.tensorrt_plugins import check_channels_last_padding
    op = next(op for op in FUSED_OPS if op.channels_last)
    check_channels_last_padding(op, [TensorArg((1, 96, 3, 4, 6), torch.bfloat16), TensorArg((96,), torch.float32)])
    check_channels_last_padding(op, [TensorArg((1, 3, 3, 4, 6), torch.float32)])
    with pytest.raises(WanTrtError, match="a torch.float16 tensor of 12 channels reaches TensorRT's plugin as DHWC8"):
        check_channels_last_padding(op, [TensorArg((1, 12, 3, 4, 6), torch.float16)])
