"""Export of the small configs (all three shapes): structure, manifest, ONNX Runtime accuracy, bad input."""
import json
import shutil
import sys

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.errors import WanTrtError
from wan_trt.export.graph import check_graph, load_structure
from wan_trt.export.manifest import Manifest
from wan_trt.export.transformer import export_transformer
from wan_trt.model import build_model
from wan_trt.model.checkpoint import save_checkpoint
from wan_trt.spec import PassSpec
from wan_trt.validate.check import CheckOptions, check_export
from tests.conftest import SMALL


@pytest.mark.parametrize("name", SMALL + ["opset18"])
def test_export_and_check_pass_on_onnxruntime_cpu(exports, name):
    report = check_export(exports[name], CheckOptions(provider="cpu", blocks=8, seed=1))
    assert report.ok, report.table()
    deep = list(range(43688, 43692))  # across latent frame 2**17
    assert [b["block"] for b in report.stream] == list(range(8)) + deep
    assert len(report.outputs) == len(Manifest.read(exports[name]).spec.outputs)
    assert (exports[name] / "check" / "run_results_onnxruntime-cpu.json").is_file()
    assert "notes" not in report.as_dict() and "note:" not in report.table()  # no plugin nodes: nothing to say


def test_graph_is_static_and_spec_shaped(exports):
    manifest = Manifest.read(exports["universal-small"])
    model = load_structure(exports["universal-small"] / manifest.graph)
    for value in list(model.graph.input) + list(model.graph.output):
        assert all(d.HasField("dim_value") for d in value.type.tensor_type.shape.dim), value.name
    assert manifest.op_counts.get("Attention", 0) > 0  # opset 23 uses the fused op
    assert Manifest.read(exports["opset18"]).op_counts.get("Softmax", 0) > 0
    assert manifest.weights["source"] == "random" and len(manifest.weights["sha256"]) == 64


def test_manifest_alone_allocates_every_buffer(exports):
    data = json.loads((exports["templerun-small"] / "manifest.json").read_text())
    spec = PassSpec.from_dict(data["spec"])
    buffers = spec.allocate("inputs") | spec.allocate("outputs")
    model = load_structure(exports["templerun-small"] / data["graph"])
    for value in list(model.graph.input) + list(model.graph.output):
        dims = tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
        assert tuple(buffers[value.name].shape) == dims


def test_check_fails_when_a_graph_weight_is_perturbed(exports, tmp_path):
    src = exports["universal-small"]
    bad = tmp_path / "bad"
    shutil.copytree(src, bad, ignore=shutil.ignore_patterns("check"))
    model = onnx.load(str(bad / "model.onnx"))
    target = max(model.graph.initializer, key=lambda i: np.prod(i.dims) if "ffn" in i.name else 0)
    values = onnx.numpy_helper.to_array(target).copy()
    values.flat[: values.size // 4] += 0.05  # a quarter of one FFN weight
    target.CopyFrom(onnx.numpy_helper.from_array(values, target.name))
    onnx.save(model, str(bad / "model.onnx"))
    Manifest.read(bad, verify=False).write(bad)  # record the new graph's hash: the accuracy check must catch it
    report = check_export(bad, CheckOptions(provider="cpu", blocks=2, seed=1))
    assert not report.ok
    assert any(not o.ok for o in report.outputs) and report.problems()


def test_check_refuses_a_graph_with_random_bytes_before_parsing_it(exports, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(exports["universal-small"], bad, ignore=shutil.ignore_patterns("check"))
    with open(bad / "model.onnx", "r+b") as f:
        f.seek(len((bad / "model.onnx").read_bytes()) // 2)
        f.write(np.random.default_rng(0).bytes(64))
    res = CliRunner().invoke(main, ["check", str(bad), "--blocks", "1"])
    assert res.exit_code == 1 and res.output.startswith("error:"), res.output
    assert "model.onnx has changed since it was written" in res.output and "re-export" in res.output
    with open(bad / "model.onnx", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(WanTrtError, match="model.onnx is 1000 bytes"):
        check_export(bad, CheckOptions(provider="cpu", blocks=1))


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_low_precision_graphs_are_structurally_sound(tmp_path, precision):
    manifest = export_transformer(load_config("universal-small"), tmp_path / precision, precision)
    counts = check_graph(tmp_path / precision / "model.onnx", manifest.spec)  # checker + spec + no float64
    assert counts["Cast"] > 0  # fp32 islands
    model = load_structure(tmp_path / precision / "model.onnx")
    assert model.graph.input[0].type.tensor_type.elem_type == (onnx.TensorProto.BFLOAT16 if precision == "bf16"
                                                               else onnx.TensorProto.FLOAT16)


def test_fp16_model_keeps_an_fp32_residual_stream():
    model = build_model(load_config("universal-small"), torch.float16)
    assert model.residual_dtype == torch.float32


def test_existing_out_needs_overwrite(exports):
    with pytest.raises(WanTrtError, match="--overwrite"):
        export_transformer(load_config("universal-small"), exports["universal-small"], "fp32")


def test_mismatched_checkpoint_writes_nothing(tmp_path):
    ckpt = save_checkpoint(build_model(load_config("gta_drive-small")), tmp_path / "gta.safetensors")
    with pytest.raises(WanTrtError, match="does not match"):
        export_transformer(load_config("universal-small"), tmp_path / "out", "fp32", weights=str(ckpt))
    assert not (tmp_path / "out").exists()


def test_incomplete_export_is_refused(tmp_path, exports):
    partial = tmp_path / "partial"
    shutil.copytree(exports["gta_drive-small"], partial)
    (partial / "sample_inputs.safetensors").unlink()
    with pytest.raises(WanTrtError, match="incomplete"):
        Manifest.read(partial)
    with pytest.raises(WanTrtError, match="no manifest.json"):
        Manifest.read(tmp_path)


def test_wrong_shapes_fed_to_the_graph(exports):
    from wan_trt.engines.backends.onnxruntime import OnnxRuntimeRunner
    manifest = Manifest.read(exports["universal-small"])
    feeds = manifest.spec.sample_inputs()
    feeds["mouse_window"] = feeds["mouse_window"][:, :2].contiguous()
    with OnnxRuntimeRunner(exports["universal-small"] / "model.onnx", manifest.spec) as runner:
        with pytest.raises(WanTrtError, match="input 'mouse_window': expected"):
            runner.infer(feeds)


def test_cli_export_and_check(tmp_path):
    runner = CliRunner()
    out = tmp_path / "cli"
    res = runner.invoke(main, ["export", "--config", "templerun-small", "--precision", "fp32", "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(main, ["check", str(out), "--blocks", "8"])
    assert res.exit_code == 0, res.output
    assert "block 7" in res.output
    shutil.rmtree(out / "check")
    res = runner.invoke(main, ["check", str(out), "--blocks", "2", "--json", "--no-save-results"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)  # stdout holds the report alone (Polygraphy's chatter goes to stderr)
    assert report["ok"] and len(report["stream"]) == 2 + 4 and report["single_pass"][0]["output"] == "flow"
    assert not list((out / "check").glob("run_results_*.json"))  # --no-save-results: only the report
    # an export's report named no digest of what it judged (engine_sha256 null): it names the manifest it read,
    # which records every file's digest
    assert report["manifests"] == {str(out.resolve()): Manifest.read(out).sha256} and report["engine_sha256"] is None
    res = runner.invoke(main, ["export", "--config", "nope", "--out", str(tmp_path / "x")])
    assert res.exit_code == 1 and "neither a preset" in res.output


def test_check_without_polygraphy_is_a_clear_error(exports, monkeypatch):
    monkeypatch.setitem(sys.modules, "polygraphy", None)  # what an install without the dependency looks like
    with pytest.raises(WanTrtError, match="pip install 'polygraphy"):
        check_export(exports["universal-small"], CheckOptions(provider="cpu", blocks=1))


def test_fp16_graph_passes_the_same_check(tmp_path):
    """fp16 (fp32 residual stream and norms) against fp32, yardstick: the fp16 PyTorch model."""
    export_transformer(load_config("universal-small"), tmp_path / "fp16", "fp16", seed=3)
    report = check_export(tmp_path / "fp16", CheckOptions(provider="cpu", blocks=8, seed=1))
    assert report.ok, report.table()
    assert report.precision == "fp16" and all(o.stats.non_finite == 0 for o in report.outputs)


def _swap_first_outputs(model):
    graph = model.graph
    first, second = graph.output[0], graph.output[1]
    a, b = type(first)(), type(second)()
    a.CopyFrom(first)
    b.CopyFrom(second)
    graph.output[0].CopyFrom(b)
    graph.output[1].CopyFrom(a)


def _drop_last_output(model):
    model.graph.output.pop()


def _shadow_an_input(model):
    import numpy as np
    import onnx.numpy_helper
    graph = model.graph
    dims = [d.dim_value for d in next(i for i in graph.input if i.name == "timestep").type.tensor_type.shape.dim]
    graph.initializer.append(onnx.numpy_helper.from_array(np.full(dims, 500.0, dtype=np.float32), "timestep"))


@pytest.mark.parametrize("edit, phrase", [(_swap_first_outputs, "outputs"), (_drop_last_output, "outputs"),
                                          (_shadow_an_input, "timestep")])
def test_a_graph_whose_io_is_not_its_specs_fails_the_check_with_one_error_line(exports, tmp_path, edit, phrase):
    """The structural check ran only at export: a graph with two outputs swapped (ONNX Runtime binds by name) or
    an input shadowed by a constant passed `wan-trt check`; one that lost an output crashed it with a
    traceback from ONNX Runtime."""
    import shutil

    from click.testing import CliRunner

    from wan_trt.cli import main
    from tests.conftest import edited_graph
    shutil.copytree(exports["universal-small"], tmp_path / "edited")
    edited = edited_graph(tmp_path / "edited", edit)
    res = CliRunner().invoke(main, ["check", str(edited), "--blocks", "2"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    errors = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert errors and phrase in errors[0] and "Traceback" not in res.output, res.output


def _double_constant(model):
    import onnx.helper as h
    model.graph.node.append(h.make_node("Constant", [], ["dbl"], name="dbl", value=h.make_tensor(
        "dbl", onnx.TensorProto.DOUBLE, [1], [0.5])))


def _double_constant_of_shape(model):
    import onnx.helper as h
    model.graph.node.extend([
        h.make_node("Constant", [], ["shape"], name="shape",
                    value=h.make_tensor("s", onnx.TensorProto.INT64, [1], [2])),
        h.make_node("ConstantOfShape", ["shape"], ["zeros"], name="zeros",
                    value=h.make_tensor("v", onnx.TensorProto.DOUBLE, [1], [0.0]))])


def _double_value(model):
    import onnx.helper as h
    node = next(n for n in model.graph.node if n.op_type == "MatMul")
    model.graph.value_info.append(h.make_tensor_value_info(node.output[0], onnx.TensorProto.DOUBLE, None))


def _double_in_a_function(model):
    import onnx.helper as h
    body = h.make_node("Constant", [], ["y"], value=h.make_tensor("c", onnx.TensorProto.DOUBLE, [1], [1.0]))
    default = next(o for o in model.opset_import if o.domain in ("", "ai.onnx"))
    model.functions.append(h.make_function("local", "Half", [], ["y"], [body], [default]))
    model.opset_import.append(h.make_opsetid("local", 1))


def _double_in_a_subgraph(model):
    import numpy as np
    import onnx.helper as h
    import onnx.numpy_helper

    def branch(name):
        constant = onnx.numpy_helper.from_array(np.array([0.5]), f"{name}_c")  # float64
        return h.make_graph([h.make_node("Identity", [f"{name}_c"], [f"{name}_o"])], name, [],
                            [h.make_tensor_value_info(f"{name}_o", onnx.TensorProto.DOUBLE, [1])], [constant])
    model.graph.node.extend([
        h.make_node("Constant", [], ["cond"], name="cond", value=h.make_tensor("b", onnx.TensorProto.BOOL, [], [1])),
        h.make_node("If", ["cond"], ["picked"], name="if", then_branch=branch("then"), else_branch=branch("other"))])


def _double_eye(model):
    import onnx.helper as h
    model.graph.node.extend([
        h.make_node("Constant", [], ["square"], name="square",
                    value=h.make_tensor("s", onnx.TensorProto.FLOAT, [2, 2], [0.0] * 4)),
        h.make_node("EyeLike", ["square"], ["eye"], name="eye", dtype=onnx.TensorProto.DOUBLE)])


def _double_sparse_constant(model):
    import onnx.helper as h
    values = h.make_sparse_tensor(h.make_tensor("v", onnx.TensorProto.DOUBLE, [1], [1.0]),
                                  h.make_tensor("i", onnx.TensorProto.INT64, [1], [0]), [3])
    model.graph.node.append(h.make_node("Constant", [], ["sparse"], name="sparse", sparse_value=values))


@pytest.mark.parametrize("edit, place", [(_double_constant, "node 'dbl'"), (_double_constant_of_shape, "node 'zeros'"),
                                         (_double_value, "value '"), (_double_in_a_function, "function 'Half'"),
                                         (_double_in_a_subgraph, "node 'if': initializer 'then_c'"),
                                         (_double_eye, "node 'eye' makes float64"),
                                         (_double_sparse_constant, "node 'sparse'")])
def test_a_float64_tensor_anywhere_in_the_graph_breaks_its_spec(exports, tmp_path, edit, place):
    """TensorRT has no float64: the structural check looked at initializers and casts only, so a float64 constant,
    a float64 intermediate or one inside a local function passed it."""
    directory = shutil.copytree(exports["universal-small"], tmp_path / "edited")
    spec = Manifest.read(directory).spec
    model = load_structure(directory / "model.onnx")
    edit(model)
    onnx.save(model, str(directory / "model.onnx"))
    with pytest.raises(WanTrtError, match="float64") as err:
        check_graph(directory / "model.onnx", spec)
    assert place in str(err.value)


@pytest.mark.parametrize("graph", ["pass", "decoder"])
def test_a_checkpoint_rewritten_while_the_export_read_it_is_not_recorded_as_read(tmp_path, monkeypatch, graph):
    """The manifest hashed the checkpoint after the export: a file rewritten meanwhile was recorded by its new sha256,
    another file than the one the graph's weights came from (a build given that file took it for the export's)."""
    from dataclasses import replace

    from wan_trt.export.decoder import export_decoder
    from wan_trt.graphs import GRAPH_KINDS
    from wan_trt.model import build_decoder
    from tests.model.test_vae import _write_vae_file
    cfg = load_config("universal-small")
    write = {"pass": lambda seed, path: save_checkpoint(build_model(cfg, seed=seed), path),
             "decoder": lambda seed, path: _write_vae_file(build_decoder(cfg, seed=seed), path)}[graph]
    ckpt = tmp_path / ("weights.safetensors" if graph == "pass" else "vae.pth")
    write(1, ckpt)
    kind = GRAPH_KINDS[graph]

    def rewritten_meanwhile(*args, **kwargs):  # the module is built for real; the file changes after it is read
        module = kind.build(*args, **kwargs)
        write(2, ckpt)
        return module
    monkeypatch.setitem(GRAPH_KINDS, graph, replace(kind, build=rewritten_meanwhile))
    export = {"pass": export_transformer, "decoder": export_decoder}[graph]
    with pytest.raises(WanTrtError, match="rewritten while the export read it"):
        export(cfg, tmp_path / "out", "fp32", str(ckpt), onnx=False)
    assert not any((tmp_path / "out").rglob("*"))  # no export, no staging folder (a decoder's out/ may stay empty)
