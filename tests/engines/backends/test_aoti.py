"""AOTInductor engine on the CPU: build, check, Python runtime, bench, bad input (the C++ runtime:
tests/engines/runtime/test_cpp.py; the package is the session-wide ``aoti`` fixture of tests/conftest.py)."""
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from wan_trt.cli import main
from wan_trt.config_load import load_config
from wan_trt.engines.backends.aoti import AotiRunner, build_aoti
from wan_trt.engines.backends.inductor_fixes import make_libstdcxx_global
from wan_trt.engines.runtime.session import StreamingSession
from wan_trt.errors import WanTrtError
from wan_trt.export.manifest import Manifest
from wan_trt.export.transformer import export_transformer
from wan_trt.stream import synthetic_stream


def test_aoti_step_before_start_is_an_error(aoti):
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    cfg = manifest.spec.config
    inputs = synthetic_stream(cfg, 1)
    with AotiRunner(engine, manifest) as runner:
        with pytest.raises(WanTrtError, match=r"step\(\) before start\(\)"):
            StreamingSession(runner).step(inputs.block_cond(cfg, 0), *inputs.block_actions(cfg, 0))


def test_check_engine_passes(aoti):
    res = CliRunner().invoke(main, ["check", str(aoti[1]), "--blocks", "8"])
    assert res.exit_code == 0, res.output
    assert "block 7" in res.output
    assert f"checking against its export {aoti[0].resolve()}" in res.output  # says which export


def test_export_without_onnx_refuses_onnx_backends_clearly(aoti):
    manifest = Manifest.read(aoti[0])
    assert manifest.graph is None and not (aoti[0] / "model.onnx").exists()
    res = CliRunner().invoke(main, ["check", str(aoti[0]), "--blocks", "2"])
    assert res.exit_code != 0 and "--no-onnx" in res.output, res.output


def test_libstdcxx_is_made_global_for_packages():
    import ctypes
    assert make_libstdcxx_global()
    assert hasattr(ctypes.CDLL(None), "_ZNSt6locale7classicEv")  # std::locale::classic(), in the global scope


def test_wrapper_compile_error_is_reported_clearly(aoti, tmp_path, monkeypatch):
    from torch._inductor.exc import CppCompileError

    def failing_compile(program, package_path):
        Path(package_path).write_bytes(b"half a package")
        raise CppCompileError(["g++", "wrapper.cpp"], "wrapper.cpp:1:2: error: 'int_array_3' was not declared")
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", failing_compile)
    with pytest.raises(WanTrtError, match="int_array_3.*code-generation error"):
        build_aoti(aoti[0], tmp_path / "engine.pt2", device="cpu")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_rebuild_is_skipped_when_up_to_date(aoti):
    export_dir, engine = aoti
    before = engine.stat().st_mtime_ns
    assert build_aoti(export_dir, device="cpu") == engine and engine.stat().st_mtime_ns == before


def test_engine_of_another_export_is_refused(aoti, tmp_path):
    export_dir, engine = aoti
    other = tmp_path / "other"
    export_transformer(load_config("universal-small"), other, "fp32", seed=99)  # other weights
    with pytest.raises(WanTrtError, match="weights differ"):
        AotiRunner(engine, Manifest.read(other))
    bf16 = tmp_path / "bf16"
    export_transformer(load_config("universal-small"), bf16, "bf16", seed=2)
    with pytest.raises(WanTrtError, match="precision fp32, manifest bf16"):
        AotiRunner(engine, Manifest.read(bf16))


def test_engine_without_metadata_is_refused(aoti, tmp_path):
    copy = tmp_path / "engine.pt2"
    shutil.copy(aoti[1], copy)
    with pytest.raises(WanTrtError, match="not built by `wan-trt build`"):
        AotiRunner(copy, Manifest.read(aoti[0]))


def test_inspect_and_bench_on_cpu(aoti, tmp_path):
    export_dir, engine = aoti
    res = CliRunner().invoke(main, ["inspect", str(engine), "--json"])
    info = json.loads(res.output)
    assert res.exit_code == 0 and info["summary"]["backend"] == "aoti"
    assert info["summary"]["fused_kernels"] == 0 and info["fused_kernels"] == {}  # native ops: none
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", str(export_dir), "--device", "cpu", "--blocks", "3", "--aoti-engine",
                                    str(engine), "--backends", "reference-eager,torch-eager,aoti", "--out", str(out)])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert set(report["backends"]) == {"reference-eager", "torch-eager", "aoti"}
    assert all(r["block_ms"]["mean"] > 0 for r in report["backends"].values())
    assert not report["skipped"] and not report["failed"]


def test_inspect_counts_the_fused_kernels_a_plugins_package_holds(aoti, tmp_path):
    """The count of fused kernels in a --ops plugins package (by each registered op's Triton kernel names in the
    package's code) had only a GPU test; here a CPU package standing in for one, its code naming window attention's
    kernel once, is counted so (and nothing else)."""
    from tests.conftest import package_stand_in
    from wan_trt.plugins.window_attention import _window_attention_kernel
    plugins = package_stand_in(aoti[1], tmp_path / "plugins.pt2", fused_kernel=_window_attention_kernel.__name__)
    res = CliRunner().invoke(main, ["inspect", str(plugins), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["fused_kernels"] == {"window_attention": 1} and info["summary"]["fused_kernels"] == 1, info


def test_inspect_names_the_files_inside_the_package_not_the_staging_file_it_was_built_as(aoti):
    """`inspect --json` listed every file under `.engine_aoti_cpu.pt2.partial-XXXXXXXX/`: the zip keeps the name of
    the staging file the build wrote it as, gone once the package was renamed into place."""
    res = CliRunner().invoke(main, ["inspect", str(aoti[1]), "--json"])
    files = json.loads(res.output)["files"]
    assert res.exit_code == 0 and not [f for f in files if "partial" in f or aoti[1].stem in f], files
    assert {"archive_format", "archive_version"} <= set(files), files
    assert any(f.startswith("data/aotinductor/model/") and f.endswith(".so") for f in files), files


def test_bench_refuses_an_engine_of_another_export(aoti, tmp_path):
    other = tmp_path / "other"
    export_transformer(load_config("universal-small"), other, "fp32", seed=99, onnx=False)  # other weights
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", str(other), "--device", "cpu", "--blocks", "2", "--aoti-engine",
                                    str(aoti[1]), "--backends", "torch-eager,aoti", "--out", str(out)])
    assert res.exit_code == 1 and "failed: aoti" in res.output, res.output
    report = json.loads(out.read_text())
    assert "weights differ" in report["failed"]["aoti"] and set(report["backends"]) == {"torch-eager"}


def test_cuda_graph_runner_needs_cuda(aoti):
    from wan_trt.engines.runtime.cuda_graph import CudaGraphRunner
    with pytest.raises(WanTrtError, match="CUDA graphs need a CUDA runner"):
        CudaGraphRunner(AotiRunner(aoti[1], Manifest.read(aoti[0])))


def _copy_engine(engine: Path, to: Path) -> Path:
    """The engine with its metadata and runtime file, as `wan-trt build` left them."""
    for suffix in ("", ".json", ".runtime.txt"):
        shutil.copy(engine.with_name(engine.name + suffix), to.with_name(to.name + suffix))
    return to


def test_damaged_engine_is_refused_and_rebuilt_not_reused(aoti, tmp_path, monkeypatch):
    export_dir, engine = aoti
    copy = _copy_engine(engine, tmp_path / "engine.pt2")
    data = copy.read_bytes()
    copy.write_bytes(data[: len(data) // 2])
    with pytest.raises(WanTrtError, match="engine.pt2 is .* bytes, .* were written"):
        AotiRunner(copy, Manifest.read(export_dir))
    compiled = []

    def compile_stand_in(program, package_path):  # the rebuild decision is under test, not Inductor
        compiled.append(package_path)
        Path(package_path).write_bytes(data)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_stand_in)
    assert build_aoti(export_dir, copy, device="cpu") == copy and len(compiled) == 1
    assert copy.read_bytes() == data and sorted(p.name for p in tmp_path.iterdir()) == [
        "engine.pt2", "engine.pt2.json", "engine.pt2.runtime.txt"]
    AotiRunner(copy, Manifest.read(export_dir))  # verified again: the new file is the one recorded


def test_a_fresh_build_hashes_its_engine_once(aoti, tmp_path, monkeypatch):
    """The build hashed the engine it had just written twice: once for its metadata, then again (renamed into
    place) for its runtime file; some 10 s of a full-size engine's SHA-256 for nothing."""
    import wan_trt.digest as digest
    export_dir, engine = aoti
    data = engine.read_bytes()

    def compile_stand_in(program, package_path):  # the hashing of the package is under test, not Inductor
        Path(package_path).write_bytes(data)
    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", compile_stand_in)
    read = []

    def counting_open(path, *args, **kwargs):  # file_digest reads each file it hashes (not one it knows)
        read.append(Path(path).name)
        return open(path, *args, **kwargs)
    monkeypatch.setattr(digest, "open", counting_open, raising=False)
    built = build_aoti(export_dir, tmp_path / "fresh.pt2", device="cpu")
    hashed = [name for name in read if name.startswith((".fresh.pt2.partial-", "fresh.pt2"))]
    assert len(hashed) == 1, hashed
    runtime = (tmp_path / "fresh.pt2.runtime.txt").read_text()
    assert f"engine {len(data)} {hashlib.sha256(data).hexdigest()}" in runtime.splitlines()
    AotiRunner(built, Manifest.read(export_dir))  # the metadata's record is the file's


def test_check_engine_refuses_an_export_changed_since_the_build(aoti, tmp_path):
    export_dir, engine = aoti
    shutil.copytree(export_dir, tmp_path / "export", ignore=shutil.ignore_patterns("engine*", "check"))
    copy = _copy_engine(engine, tmp_path / "engine.pt2")
    meta = json.loads((tmp_path / "engine.pt2.json").read_text())
    meta["export_dir"] = str((tmp_path / "export").resolve())  # as if built from that copy (same manifest bytes)
    (tmp_path / "engine.pt2.json").write_text(json.dumps(meta))
    export_transformer(load_config("universal-small"), tmp_path / "export", "fp32", seed=2, onnx=False,
                       overwrite=True)  # same weights, a new export
    res = CliRunner().invoke(main, ["check", str(copy), "--blocks", "1"])
    assert res.exit_code == 1 and "the export it was built from is not found" in res.output, res.output
    assert "another export" in res.output


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA packages and CUDA graphs need a CUDA device")
def test_cuda_packages_and_their_cuda_graphs_bench(aoti, tmp_path):
    """The registry's CUDA variants: the native and --ops plugins packages, each also as CUDA graphs."""
    export_dir = aoti[0]
    native = build_aoti(export_dir, tmp_path / "native.pt2", device="cuda")
    plugins = build_aoti(export_dir, tmp_path / "plugins.pt2", device="cuda", ops="plugins")
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(main, ["bench", str(export_dir), "--device", "cuda", "--blocks", "2",
                                    "--aoti-engine", str(native), "--aoti-plugins-engine", str(plugins),
                                    "--backends", "aoti,aoti+cudagraph,aoti-plugins,aoti-plugins+cudagraph",
                                    "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert set(json.loads(out.read_text())["backends"]) == {"aoti", "aoti+cudagraph", "aoti-plugins",
                                                             "aoti-plugins+cudagraph"}
    # inspect counts the fused kernels a package holds (it counted source lines naming 'wan_trt': 0 for both)
    found = {}
    for name, engine in (("native", native), ("plugins", plugins)):
        res = CliRunner().invoke(main, ["inspect", str(engine), "--json"])
        assert res.exit_code == 0, res.output
        found[name] = json.loads(res.output)["fused_kernels"]
    assert found["native"] == {}
    assert {"window_attention", "qk_norm_rope", "adaln", "add_adaln"} <= set(found["plugins"]), found


class _StridedOutputs(AotiRunner):
    """The engine's outputs with the same values in another layout (each cache output re-laid out
    with its first two dims swapped in memory: strided wherever both exceed 1, as in the mouse
    caches): what a runner may legally return, e.g. a view into a wider buffer."""

    def infer(self, feeds):
        outputs = super().infer(feeds)
        return {name: t if name == "flow" else t.transpose(0, 1).contiguous().transpose(0, 1)
                for name, t in outputs.items()}


def test_a_strided_cache_output_is_copied_not_swapped_into_the_next_pass(aoti):
    """An engine reads its inputs as dense: swapping a strided output in as the next block's cache
    would feed it scrambled keys. The session copies such an output into its buffer instead."""
    export_dir, engine = aoti
    manifest = Manifest.read(export_dir)
    cfg = manifest.spec.config
    assert cfg.prev_frames == cfg.block_frames  # universal: the commit is a swap when it can be
    inputs = synthetic_stream(cfg, 3, seed=4)
    latents = {}
    for runner_type in (AotiRunner, _StridedOutputs):
        with runner_type(engine, manifest) as runner:
            session = StreamingSession(runner, seed=4)
            session.start(inputs.visual_context)
            latents[runner_type] = [session.step(inputs.block_cond(cfg, b), *inputs.block_actions(cfg, b)).latents
                                    for b in range(3)]
            dense_feeds = all(t.is_contiguous() for t in session.feeds.values())
    for dense, strided in zip(latents[AotiRunner], latents[_StridedOutputs]):
        torch.testing.assert_close(strided, dense, atol=1e-6, rtol=1e-6)
    assert dense_feeds


@pytest.mark.parametrize("damage", ["truncate", "replace"])
def test_inspect_refuses_an_engine_that_is_not_the_one_built(aoti, tmp_path, damage):
    """inspect never compared the engine with its recorded size and sha256: a package replaced by another zip
    was described as the engine (exit 0), a truncated one crashed with BadZipFile."""
    import shutil
    import zipfile

    from wan_trt.engines.artifact import EngineMetadata
    _, engine = aoti
    copy = tmp_path / engine.name
    shutil.copy(EngineMetadata.path_for(engine), EngineMetadata.path_for(copy))
    if damage == "truncate":
        copy.write_bytes(engine.read_bytes()[:1000])
    else:
        with zipfile.ZipFile(copy, "w") as z:
            z.writestr("a.txt", "not an engine")
    res = CliRunner().invoke(main, ["inspect", str(copy)])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert res.output.startswith("error: ") and "rebuild it" in res.output, res.output


def test_an_engine_replaced_after_its_verification_is_not_loaded(aoti, tmp_path):
    """The runner verified the file when it was made and loaded it again at every activation, minutes later
    in a check: a build that installed another engine there meanwhile had it run under the verified sha256
    (found by a second reader's audit)."""
    export_dir, engine = aoti
    copy = _copy_engine(engine, tmp_path / "engine.pt2")
    runner = AotiRunner(copy, Manifest.read(export_dir))
    other = tmp_path / "other.pt2"
    shutil.copy(copy, other)
    os.replace(other, copy)  # what install_engine does: a new file renamed over the old (same bytes here)
    with pytest.raises(WanTrtError, match="replaced or rewritten since it was verified"):
        with runner:
            pass


def test_an_engine_out_without_the_pt2_suffix_is_refused_before_any_work(aoti, tmp_path, monkeypatch):
    """`build --backend aoti --out engine.bin` exported and traced the model for minutes, then stopped with
    AOTInductor's AssertionError ('Expect package path to be a file ending in .pt2'). It is now refused at once,
    naming a path that works; nothing is written."""
    import wan_trt.engines.backends.aoti as aoti_backend
    export_dir, _ = aoti

    def no_work(*args, **kwargs):
        raise AssertionError("the build started")
    monkeypatch.setattr(aoti_backend, "_compile", no_work)
    for name in ("engine.bin", "engine"):
        out = tmp_path / name
        with pytest.raises(WanTrtError, match=rf"--out {out}: --backend aoti writes a \.pt2 file; name it "
                                              rf"e\.g\. .*engine\.pt2"):
            aoti_backend.build_aoti(export_dir, out, device="cpu")
    assert not list(tmp_path.iterdir())


def test_an_engine_out_without_the_pt2_suffix_is_refused_before_an_export_is_made(tmp_path, monkeypatch):
    """`build --config C --out engine.bin` first exported C (minutes at full size), and only then refused the name."""
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["build", "--config", "universal-small", "--backend", "aoti", "--device", "cpu",
                                    "--fp32", "--out", str(tmp_path / "engine.bin")])
    assert res.exit_code == 1 and "--backend aoti writes a .pt2 file" in res.output, res.output
    assert not list(tmp_path.iterdir())  # no export made


def test_build_config_where_its_export_folder_holds_no_export_says_what_to_do(tmp_path, monkeypatch):
    """`build --config C` where out/C_fp32_native held a user's files said "--out out/C_fp32_native is not a wan-trt
    export ...; --overwrite replaces only wan-trt exports: pick another --out": build's --out names the engine and
    build has no --overwrite, so neither flag moved the export it makes."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "out" / "universal-small_fp32_native"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine")
    res = CliRunner().invoke(main, ["build", "--config", "universal-small", "--backend", "aoti", "--device", "cpu",
                                    "--fp32"])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "out/universal-small_fp32_native" in res.output and "wan-trt export --config universal-small" in \
        res.output and "--out DIR`, then `wan-trt build DIR`" in res.output, res.output
    assert "--overwrite" not in res.output and "pick another --out" not in res.output, res.output
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the package runs")
def test_checking_a_cuda_package_without_a_gpu_says_what_to_do(aoti, tmp_path):
    """A CUDA package on a machine without a GPU: `check` advised `--device cpu / --provider cpu`, which it does not
    take for an engine (it has no --device, and refuses --provider with one); a package runs where it was built."""
    from tests.conftest import package_stand_in
    engine = package_stand_in(aoti[1], tmp_path / "engine_aoti_cuda.pt2", device="cuda")  # as a GPU's build writes it
    res = CliRunner().invoke(main, ["check", str(engine), "--blocks", "2"])
    assert res.exit_code == 1 and "no CUDA device" in res.output, res.output
    assert "--provider" not in res.output and "--backend aoti --device cpu" in res.output, res.output
