"""The measuring scripts' own logic (their GPU runs are the measurements themselves)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_block_timeline_sums_the_idle_time_after_each_kind_of_activity():
    timeline = load("block_kernels").timeline
    kernels = [(0, 10, "gemm"), (14, 20, "Memset"), (25, 30, "gemm"), (30, 40, "Memset"), (46, 50, "norm")]
    result = timeline(kernels)
    assert result["idle_after"] == [["Memset", 2, 0.011], ["gemm", 1, 0.004]]  # 5 + 6 us after memsets, 4 after a gemm
    assert result["idle_ms"] == 0.015


def test_gemm_shapes_records_every_gemm_of_a_pass_with_its_count():
    spec, rows = load("gemm_shapes").pass_gemms("universal", "bf16")  # shapes only: the meta device
    cfg = spec.config
    c, tokens = cfg.model.dim, cfg.tokens_per_block
    square = next(r for r in rows if r["op"] == "addmm" and r["shapes"] == [[c], [tokens, c], [c, c]])
    # q, k, v, o of the self-attention and q, o of the cross-attention, in every layer
    assert square["calls_per_pass"] == 6 * cfg.model.num_layers
    ffn = [r for r in rows if r["op"] == "addmm" and r["shapes"][2] in ([c, cfg.model.ffn_dim], [cfg.model.ffn_dim, c])]
    assert [r["calls_per_pass"] for r in ffn] == [cfg.model.num_layers] * 2


def test_a_gap_is_charged_to_the_activity_that_ended_last_before_it():
    # a copy overlaps the long kernel and ends first: the gap follows the kernel, which ends at 30
    result = load("block_kernels").timeline([(0, 30, "attention"), (5, 10, "copy"), (34, 40, "gemm")])
    assert result["idle_after"] == [["attention", 1, 0.004]]


def test_interleaved_sessions_stream_what_each_streams_alone():
    """ab_engines --interleave steps two sessions a block each in turn: each still streams its own blocks."""
    import torch

    from wan_trt.config_load import load_config
    from wan_trt.engines.backends.torch import TorchRunner
    from wan_trt.engines.runtime.session import StreamingSession, stream_blocks
    from wan_trt.model import build_model
    from wan_trt.spec import PassSpec
    from wan_trt.stream import NoiseSource, synthetic_stream
    cfg = load_config("universal-small")
    model, spec = build_model(cfg, seed=1), PassSpec.from_config(cfg, "fp32")
    inputs = synthetic_stream(cfg, 3, seed=2)
    alone = stream_blocks(StreamingSession(TorchRunner(model, spec), noise=NoiseSource(0)), inputs, 3)
    sessions = {name: StreamingSession(TorchRunner(model, spec), noise=NoiseSource(0)) for name in ("a", "b")}
    stepped = []
    for name, session in sessions.items():
        session.step = (lambda step, name: lambda *a, **k: stepped.append(name) or step(*a, **k))(session.step, name)
    both = load("ab_engines").interleaved(sessions, inputs, 3)
    assert stepped == ["a", "b", "b", "a", "a", "b"]  # the order turns every block
    for name, results in both.items():
        assert [r.index for r in results] == [0, 1, 2]
        for got, want in zip(results, alone):
            torch.testing.assert_close(got.latents, want.latents, rtol=0, atol=0)


def test_paired_differences_say_which_engine_was_faster():
    report = load("ab_engines").paired({"a": [10.0, 10.0, 10.0, 12.0], "b": [9.0, 11.0, 8.0, 11.0]})
    assert report == {"b": {"against": "a", "median_diff_ms": -1.0, "faster_in": 3, "pairs": 4,
                            "median_diff_ms_by_order": {"ran_first": 0.0, "ran_second": -1.5}}}


def test_interleaved_engines_take_turns_stepping_first():
    """With a fixed order the engine stepped first was the faster whichever it was: the order turns every
    block, and the differences are also reported by which engine stepped first."""
    ab = load("ab_engines")
    assert [ab.block_order(["a", "b"], b) for b in range(3)] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert [ab.block_order(["a", "b", "c"], b)[0] for b in range(4)] == ["a", "b", "c", "a"]
    # b steps second at blocks 2 and 4, first at 3 and 5: +1 when second, -3 when first
    report = ab.paired({"a": [10.0, 10.0, 10.0, 10.0], "b": [11.0, 7.0, 11.0, 7.0]}, first_block=2)
    assert report["b"]["median_diff_ms_by_order"] == {"ran_first": -3.0, "ran_second": 1.0}


def test_every_result_writing_script_records_its_command_device_and_code():
    """conv_widths.py and guard_export_memory.py recorded no source commit; fp8_stress.py (--device cpu by
    default) and cpp_stream.py recorded the current CUDA device whatever --device said; every script wrote its
    file in place, so one that failed while writing left half a file where the earlier result was. A script that
    writes a result file starts it with provenance(), given the script's --device where it takes one, and writes
    it through write_result."""
    import ast

    missing, deviceless, unstaged = [], [], []
    for path in sorted(SCRIPTS.glob("*.py")):
        source = path.read_text()
        if "--out" not in source or "json.dump" not in source:
            continue
        calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", getattr(n.func, "attr", None)) == "provenance"]
        if not calls:
            missing.append(path.name)
        elif any(isinstance(n, ast.Call) and getattr(n.func, "attr", None) in ("write_text", "dump")
                 for n in ast.walk(ast.parse(source))):
            unstaged.append(path.name)
        elif 'add_argument("--device"' in source and not all(
                any(k.arg == "device" for k in c.keywords) or len(c.args) > 1 for c in calls):
            deviceless.append(path.name)
    assert not missing and not deviceless and not unstaged, (
        f"no provenance(): {missing}; provenance() without --device: {deviceless}; written in place (not through "
        f"write_result, whole or not at all): {unstaged}")


def test_a_summary_of_runs_names_the_command_that_made_it(tmp_path):
    """time_blocks.py --summarize wrote the first run's command as the file's, as if one run had made it."""
    import json
    import subprocess
    import sys

    runs = tmp_path / "runs.jsonl"
    run = {"tag": "a", "ms": [80.0, 81.0, 82.0], "source": None, "environment": {"device": "GPU"}}
    runs.write_text("\n".join(json.dumps({**run, "command": f"time_blocks.py a export{i}"}) for i in range(2)) + "\n")
    out = tmp_path / "summary.json"
    subprocess.run([sys.executable, str(SCRIPTS / "time_blocks.py"), "--summarize", str(runs), "--out", str(out)],
                   check=True, capture_output=True)
    summary = json.loads(out.read_text())
    assert summary["command"] == f"time_blocks.py --summarize {runs} --out {out}", summary["command"]
    assert summary["environment"] == {"device": "GPU"} and len(summary["runs"]) == 2


def test_a_check_that_writes_nothing_leaves_the_earlier_result_whole(tmp_path):
    """gpu_bench.sh check redirected the check's output into its result file, which the shell emptied before
    the check ran: a check that failed to start left an empty file where the earlier result was."""
    import os
    import subprocess
    import sys

    results = tmp_path / "results"
    results.mkdir()
    earlier = results / "check_nosuchconfig_fp32_aoti_plugins.json"
    earlier.write_text('{"ok": true}')
    env = {**os.environ, "CONFIG": "nosuchconfig", "PRECISION": "fp32",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    run = subprocess.run(["bash", str(SCRIPTS / "gpu_bench.sh"), "check", str(results)], env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0 and "does not exist" in run.stdout + run.stderr, run.stdout + run.stderr
    assert earlier.read_text() == '{"ok": true}' and sorted(p.name for p in results.iterdir()) == [
        "check.log", earlier.name]


def _summarize(tmp_path, runs: list[dict]):
    """time_blocks.py --summarize over ``runs``: (the finished process, the summary file)."""
    import json
    import subprocess
    import sys

    lines = tmp_path / "runs.jsonl"
    lines.write_text("".join(json.dumps({"command": "time_blocks.py", **run}) + "\n" for run in runs))
    out = tmp_path / "summary.json"
    done = subprocess.run([sys.executable, str(SCRIPTS / "time_blocks.py"), "--summarize", str(lines), "--out",
                           str(out)], capture_output=True, text=True)
    return done, out


def test_a_summary_names_each_settings_environment_and_refuses_a_tag_run_from_two_sources(tmp_path):
    """The summary's environment was its first run's: an A/B of CUBLASLT_WORKSPACE_SIZE=0 against 1024 said 0 for
    the whole file. A tag's source was its first run's: a tag whose later runs came from changed (dirty) code was
    pooled into one p50 under the first run's clean commit."""
    import json

    clean = {"commit": "c0ffee", "dirty": False, "tree": "t1"}
    def run(tag, value, source=clean):
        return {"tag": tag, "ms": [80.0, 81.0], "source": source,
                "environment": {"device": "GPU", "variables": {"CUBLASLT_WORKSPACE_SIZE": value}}}
    done, out = _summarize(tmp_path, [run("ws0", "0"), run("ws1024", "1024"), run("ws0", "0")])
    assert done.returncode == 0, done.stderr
    summary = json.loads(out.read_text())
    assert summary["environment"] == {"device": "GPU"}  # what every run shared
    assert [summary["ms_per_block"][tag]["environment"]["variables"] for tag in ("ws0", "ws1024")] == [
        {"CUBLASLT_WORKSPACE_SIZE": "0"}, {"CUBLASLT_WORKSPACE_SIZE": "1024"}]
    out.unlink()
    done, out = _summarize(tmp_path, [run("ws0", "0"), run("ws0", "0", {**clean, "dirty": True, "tree": "t2"})])
    assert done.returncode != 0 and "ws0" in done.stderr and "source" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and not out.exists()


def test_a_kernel_timing_that_falls_back_to_eager_calls_is_recorded():
    """bench_kernels' timed() timed a call that CUDA graphs cannot capture as eager calls (launch overhead
    included) and reported it among the device times without a word."""
    import pytest
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (the timings are CUDA graphs' or CUDA events')")
    bench = load("bench_kernels")
    x = torch.ones(8, device="cuda")
    graphed = bench.timed(lambda: x * 2)
    assert graphed > 0 and bench.EAGER_TIMINGS == []
    eager = bench.timed(lambda: (x * 2).cpu())  # a device-to-host copy syncs: no capture
    assert eager > 0 and len(bench.EAGER_TIMINGS) == 1 and "capture failed" in bench.EAGER_TIMINGS[0]
