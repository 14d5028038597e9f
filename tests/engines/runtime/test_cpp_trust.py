"""What the C++ runtime (wan_stream) trusts: its runtime file, its inputs file, its flags. Each defect of
them is refused before any block runs, on one line naming the file or flag, with nothing written."""
import re
import shutil
import subprocess

import pytest
import torch

from tests.engines.runtime.test_cpp import TENSORRT_PLAN, tensorrt_plan_stand_in
from wan_trt.engines.runtime.cpp import write_stream_inputs
from wan_trt.engines.runtime.runtime_file import sealed
from wan_trt.export.manifest import Manifest
from wan_trt.stream import synthetic_stream


def _inputs(aoti, tmp_path, blocks=1, **fields):
    """The stream inputs file of ``blocks`` blocks, its dict's ``fields`` replaced."""
    import torch
    inputs = synthetic_stream(Manifest.read(aoti[0]).spec.config, blocks, seed=9)
    path = write_stream_inputs(inputs, tmp_path / "in.pt")
    if fields:
        torch.save({**torch.load(path), **fields}, path)
    return path


def _refused(wan_stream, engine, inputs, tmp_path, *flags):
    """wan_stream's exit status and stderr over one block, once it is known to have run none and written nothing."""
    out = tmp_path / "out.pt"
    proc = subprocess.run([str(wan_stream), "--engine", str(engine), "--inputs", str(inputs), "--blocks", "1",
                           "--out", str(out), *flags], capture_output=True, text=True, errors="replace")
    assert proc.returncode != 0 and "block 0" not in proc.stdout, (proc.returncode, proc.stdout, proc.stderr)
    assert not out.exists()
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # one line, no backtrace
    return proc.returncode, proc.stderr.strip()


# ---- the runtime file --------------------------------------------------------------------------

def _engine_with_runtime(aoti, tmp_path, edit, reseal):
    """A copy of the engine beside its runtime file, whose lines before the sha256 line went through ``edit``
    (and, with ``reseal``, a sha256 line made anew for them: a well-formed file holding a bad value)."""
    engine = aoti[1]
    copy = tmp_path / "engine" / engine.name
    copy.parent.mkdir()
    shutil.copy(engine, copy)
    lines = engine.with_name(engine.name + ".runtime.txt").read_text().splitlines(keepends=True)
    assert lines[-1].startswith("sha256 ")
    body = "".join(edit(lines[:-1]))
    runtime = copy.with_name(copy.name + ".runtime.txt")
    runtime.write_text(sealed(body) if reseal else body + lines[-1])
    return copy, runtime


def _replace(key, value):
    return lambda lines: [f"{key} {value}\n" if line.split()[0] == key else line for line in lines]


def _sigma_nudged(lines):
    return [line.replace("sigmas 1.0 ", "sigmas 1.0000001 ") for line in lines]


def _without_a_cache_line(lines):
    first = next(i for i, line in enumerate(lines) if line.startswith("cache "))
    return lines[:first] + lines[first + 1:]


EDITED = "its contents are not those its sha256 line was written for"


@pytest.mark.parametrize("edit, reseal, message", [
    (_sigma_nudged, False, EDITED),  # streamed other latents, exit 0
    (_replace("ratio", 2), False, EDITED),
    (_replace("prev_frames", 1), False, EDITED),
    (_without_a_cache_line, False, EDITED),
    (_replace("block_frames", 0), False, EDITED),  # SIGFPE
    (_replace("block_frames", 0), True, "cannot read its line 'block_frames 0'"),
    (_replace("block_frames", "3x"), True, "cannot read its line 'block_frames 3x'"),  # read as 3
    (_replace("ratio", "four"), True, "cannot read its line 'ratio four'"),  # read as 0
    (_replace("clean_timestep", ""), True, "cannot read its line 'clean_timestep '"),
    (lambda lines: [line.replace("float32", "float33", 1) if line.startswith("input ") else line for line in lines],
     True, "cannot read its line 'input .* float33 "),
])
def test_an_edited_or_bad_runtime_file_is_refused(aoti, wan_stream, tmp_path, edit, reseal, message):
    """The runtime file says how to stream (schedule, cache layout, rotary frequencies, dtypes): an edited one
    streamed other latents with exit 0, `block_frames 0` died of SIGFPE, and a value that did not parse was
    read as far as it went. Its sha256 line is checked before any field is read, and every field must parse."""
    engine, runtime = _engine_with_runtime(aoti, tmp_path, edit, reseal)
    code, stderr = _refused(wan_stream, engine, _inputs(aoti, tmp_path), tmp_path)
    assert code == 1 and stderr.startswith(f"error: {runtime}"), stderr
    assert re.search(message, stderr) and "rebuild with `wan-trt build`" in stderr, stderr


def test_a_runtime_file_without_its_sha256_line_is_refused(aoti, wan_stream, tmp_path):
    engine, runtime = _engine_with_runtime(aoti, tmp_path, lambda lines: lines, reseal=False)
    runtime.write_text("".join(runtime.read_text().splitlines(keepends=True)[:-1]))  # cut before its last line
    code, stderr = _refused(wan_stream, engine, _inputs(aoti, tmp_path), tmp_path)
    assert code == 1 and stderr == (f"error: {runtime}: no sha256 line at its end (a cut file): rebuild with "
                                    "`wan-trt build`, which keeps an up-to-date engine and writes its runtime file "
                                    "anew"), stderr


# Started from a small process of its own: a child's peak memory (ru_maxrss) counts what it held before its exec,
# a fork of the test process (over 1 GiB late in a full test run), not wan_stream's own alone.
_PEAK_OF = ("import os, subprocess, sys\n"
            "with open(sys.argv[1], 'w') as err:\n"
            "    proc = subprocess.Popen(sys.argv[2:], stdout=subprocess.DEVNULL, stderr=err)\n"
            "    _, status, usage = os.wait4(proc.pid, 0)\n"
            "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)")


def _large_file_run(wan_stream, tmp_path, *args):
    """Run wan_stream with ``args``, in which BIG stands for a 2 GiB file (sparse) of zeros: (exit status, stderr,
    the process's own peak memory in KiB, the file)."""
    import sys
    big = tmp_path / "big.pt2"
    with open(big, "wb") as f:
        f.truncate(2 << 30)
    stderr = tmp_path / "stderr.txt"
    run = subprocess.run([sys.executable, "-c", _PEAK_OF, str(stderr), str(wan_stream),
                          *(str(big) if a == "BIG" else str(a) for a in args)], capture_output=True, text=True,
                         check=True)
    code, peak_kib = map(int, run.stdout.split())
    return code, stderr.read_text().strip(), peak_kib, big


def test_a_large_file_given_as_runtime_file_is_refused_by_its_first_line(aoti, wan_stream, tmp_path):
    """A file that is no runtime file (the engine itself, given by mistake: GBs) was read whole before its first
    line was looked at. Its first line is read alone, and refused: a 2 GiB file (sparse) leaves the process far
    below 2 GiB of memory."""
    code, stderr, peak_kib, big = _large_file_run(wan_stream, tmp_path, "--engine", aoti[1], "--runtime", "BIG",
                                                  "--inputs", _inputs(aoti, tmp_path), "--out", tmp_path / "out.pt")
    assert code == 1 and stderr == f"error: {big} is not a wan-trt runtime file (wan_trt_runtime 6)", stderr
    assert peak_kib < 1 << 20, f"{peak_kib} KiB"


# ---- the inputs file -----------------------------------------------------------------------------

def test_a_large_file_given_as_inputs_is_refused_by_its_first_bytes(aoti, wan_stream, tmp_path):
    """An --inputs file was read whole before its first bytes were looked at: an engine given for it by mistake
    (GBs) filled memory first. A 2 GiB file (sparse) that is no torch.save file leaves the process far below that."""
    code, stderr, peak_kib, big = _large_file_run(wan_stream, tmp_path, "--engine", aoti[1], "--inputs", "BIG",
                                                  "--out", tmp_path / "out.pt")
    assert code == 1 and stderr.startswith(f"error: --inputs {big}: not a file torch.save wrote"), stderr
    assert peak_kib < 1 << 20, f"{peak_kib} KiB"


@pytest.mark.parametrize("first_block", [2**62, 2**61 + 1, 89478485, -1])
def test_a_first_block_past_the_streams_reach_is_refused(aoti, wan_stream, tmp_path, first_block):
    """A stream reaches 2**28 latent frames (89478485 blocks of 3): (block + 1) * block_frames overflowed for
    a first_block of 2**62, which streamed with exit 0."""
    inputs = _inputs(aoti, tmp_path, blocks=2, first_block=first_block)  # raw actions enough for a later block
    code, stderr = _refused(wan_stream, aoti[1], inputs, tmp_path)
    assert code == 1 and stderr == (f"error: --inputs {tmp_path / 'in.pt'}: first_block {first_block}: a stream "
                                    "reaches 268435456 latent frames (blocks 0 to 89478484); start at one of them"), \
        stderr


def _tensor_file(path):
    import torch
    torch.save(torch.zeros(3), path)
    return path


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp, "{path}: a folder, where a file is read; write it to a file first"),
    (lambda tmp: "/dev/null", "{path}: not a regular file, where a file is read; write it to a file first"),
    (lambda tmp: tmp / "none.pt", "{path}: no such file"),
    (lambda tmp: (tmp / "notes.txt").write_text("cond_concat") and tmp / "notes.txt",
     "{path}: not a file torch.save wrote; write it with wan_trt.engines.runtime.cpp.write_stream_inputs"),
    (lambda tmp: _tensor_file(tmp / "t.pt"), "{path}: holds a Tensor, not the dict of stream inputs "
                                             "wan_trt.engines.runtime.cpp.write_stream_inputs saves"),
])
def test_an_inputs_file_that_is_not_one_is_refused(aoti, wan_stream, tmp_path, make, message):
    """A folder, /dev/null, or a file holding something else ended in 'internal error' with a libtorch
    backtrace (exit 2)."""
    path = make(tmp_path)
    code, stderr = _refused(wan_stream, aoti[1], path, tmp_path)
    assert code == 1 and stderr == "error: --inputs " + message.format(path=path), stderr


def _cut_inputs(aoti, tmp_path):
    path = _inputs(aoti, tmp_path)
    path.write_bytes(path.read_bytes()[:1000])
    return path


WRITER = "wan_trt.engines.runtime.cpp.write_stream_inputs"


@pytest.mark.parametrize("make, message", [
    (lambda aoti, tmp: "/proc/self/mem", r"{path}: cannot be read \(Input/output error\)"),  # a read error
    (_cut_inputs, "{path}: a torch.save file libtorch cannot load (.*): cut short, or holding objects other "
                  f"than tensors, numbers, strings, lists and dicts; write it with {WRITER}"),
])
def test_an_inputs_file_that_cannot_be_read_says_why(aoti, wan_stream, tmp_path, make, message):
    """A file that could not be read, or a torch.save file cut short, was 'not a file torch.save wrote; write it
    with write_stream_inputs': the advice fits only a file in another format."""
    path = make(aoti, tmp_path)
    code, stderr = _refused(wan_stream, aoti[1], path, tmp_path)
    assert code == 1 and re.fullmatch("error: --inputs " + message.format(path=re.escape(str(path))), stderr), stderr


@pytest.mark.parametrize("fields, message", [
    ({"visual_context": torch.zeros(1, 5, 16)},
     r"visual_context has shape \[1, 5, 16\]; this engine \(universal-small\) takes \[1, 5, 32\]"),
    ({"cond_concat": torch.zeros(1, 20, 3, 8, 6)},
     r"cond_concat has shape \[1, 20, 3, 8, 6\]; this engine \(universal-small\) takes \[1, 20, F, 4, 6\] "
     r"\(F: the frames it holds\)"),
    ({"keyboard": torch.zeros(1, 9, 2)},
     r"keyboard has shape \[1, 9, 2\]; this engine \(universal-small\) takes \[1, F, 4\] \(F: the frames it holds\)"),
])
def test_inputs_of_another_shape_are_refused_naming_the_file_and_shapes(aoti, wan_stream, tmp_path, fields, message):
    """Inputs of another config ran into the session's 'visual_context: wrong shape' or 'keyboard: expected shape
    [1, 9, 4] for block 0', naming neither the file nor what it held."""
    inputs = _inputs(aoti, tmp_path, **fields)
    code, stderr = _refused(wan_stream, aoti[1], inputs, tmp_path)
    assert code == 1 and re.fullmatch(f"error: --inputs {re.escape(str(inputs))}: {message}; give inputs of "
                                      "universal-small", stderr), stderr


@pytest.mark.parametrize("fields, message", [
    ({"cond_concat": None}, "cond_concat is None, not a tensor"),
    ({"first_block": "3"}, "first_block is a String, not an integer"),
    ({"mouse": [0.0]}, "mouse is a GenericList, not a tensor or None"),
    ({"cond_concat": "zeros"}, "cond_concat is a String, not a tensor"),
])
def test_an_inputs_file_with_a_bad_field_is_refused(aoti, wan_stream, tmp_path, fields, message):
    """A missing key or a field of another type: an INTERNAL ASSERT or a backtrace (exit 2)."""
    inputs = _inputs(aoti, tmp_path, **fields)
    code, stderr = _refused(wan_stream, aoti[1], inputs, tmp_path)
    assert code == 1 and stderr == f"error: --inputs {inputs}: {message}", stderr


def test_an_inputs_file_missing_keys_names_them(aoti, wan_stream, tmp_path):
    import torch
    inputs = _inputs(aoti, tmp_path)
    kept = torch.load(inputs)
    torch.save({k: v for k, v in kept.items() if k not in ("visual_context", "cond_concat")}, inputs)
    code, stderr = _refused(wan_stream, aoti[1], inputs, tmp_path)
    assert code == 1 and stderr == (f"error: --inputs {inputs}: no visual_context, cond_concat (the dict "
                                    "wan_trt.engines.runtime.cpp.write_stream_inputs saves holds visual_context, "
                                    "cond_concat, mouse, keyboard, first_block)"), stderr


def _edited_inputs(aoti, tmp_path, edit):
    """The stream inputs file of one block, its dict gone through ``edit``."""
    path = _inputs(aoti, tmp_path)
    torch.save(edit(torch.load(path)), path)
    return path


def _without(key, renamed=None):
    return lambda d: {(renamed if k == key else k): v for k, v in d.items() if renamed or k != key}


NO_KEYBOARD = ("no keyboard (this engine, universal-small, takes keyboard actions); save them in the file, or give "
               "--actions FILE")


@pytest.mark.parametrize("edit, message", [
    (_without("keyboard"), NO_KEYBOARD),
    (lambda d: {**d, "keyboard": None}, NO_KEYBOARD),
    (_without("keyboard", renamed="keyboards"),
     f"unknown key keyboards (the dict {WRITER} saves holds visual_context, cond_concat, mouse, keyboard, first_block)"),
])
def test_an_inputs_file_without_the_engines_actions_is_refused_naming_them(aoti, wan_stream, tmp_path, edit, message):
    """A missing or misspelt action key was 'keyboard: expected shape [1, 9, 4] for block 0' from the session,
    naming neither the file nor the key."""
    inputs = _edited_inputs(aoti, tmp_path, edit)
    code, stderr = _refused(wan_stream, aoti[1], inputs, tmp_path)
    assert code == 1 and stderr == f"error: --inputs {inputs}: {message}", stderr


def test_the_actions_of_an_actions_file_need_none_in_the_inputs_file(aoti, wan_stream, tmp_path):
    """--actions replaces the inputs file's actions: the file may hold none."""
    import json
    keys = Manifest.read(aoti[0]).spec.config.model.action_config.keyboard_dim_in
    actions = tmp_path / "actions.jsonl"
    actions.write_text(json.dumps({"mouse": [0.1, 0.2], "keyboard": [1] + [0] * (keys - 1)}) + "\n")
    inputs = _edited_inputs(aoti, tmp_path, lambda d: {k: v for k, v in d.items() if k not in ("mouse", "keyboard")})
    (tmp_path / "full").mkdir()
    full = _inputs(aoti, tmp_path / "full")  # with the actions the file's replace
    runs = []
    for path in (inputs, full):
        out = path.with_name("out.pt")
        proc = subprocess.run([str(wan_stream), "--engine", str(aoti[1]), "--inputs", str(path), "--blocks", "1",
                               "--out", str(out), "--actions", str(actions)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        runs.append(torch.load(out))
    assert torch.equal(*runs)


def test_an_inputs_file_with_actions_the_engine_does_not_take_is_refused(wan_stream, tmp_path):
    """templerun takes no mouse: a mouse in the inputs file was dropped where --actions replaced the actions and
    refused by the session's step otherwise, naming no file. It is refused as the file's, before any engine loads
    (here a stand-in engine file, which nothing loads)."""
    from wan_trt.config_load import load_config
    from wan_trt.digest import file_digest
    from wan_trt.engines.runtime.runtime_file import write_runtime_file
    from wan_trt.spec import PassSpec
    cfg = load_config("templerun-small")
    assert not cfg.has_mouse
    engine = tmp_path / "engine.pt2"
    engine.write_bytes(b"a stand-in for an engine")
    manifest = Manifest(PassSpec.from_config(cfg, "fp32"), "native", 23, {"source": "random", "seed": 2,
                                                                           "sha256": "0" * 64})
    write_runtime_file(manifest, engine, file_digest(engine), "cpu")
    stream = synthetic_stream(cfg, 1, seed=9)
    assert stream.mouse is None
    inputs = write_stream_inputs(stream, tmp_path / "in.pt")
    torch.save({**torch.load(inputs), "mouse": torch.zeros(1, 9, 2)}, inputs)
    code, stderr = _refused(wan_stream, engine, inputs, tmp_path)
    assert code == 1 and stderr == (f"error: --inputs {inputs}: mouse: this engine (templerun-small) takes no mouse "
                                    "actions; give inputs of templerun-small (their mouse is None)"), stderr


# ---- the flags -------------------------------------------------------------------------------------

def test_cuda_without_a_cuda_libtorch_is_refused_on_one_line(aoti, wan_stream, tmp_path):
    """A multi-line internal error (exit 2) where --cuda-graph already said it in one line. (The engine's runtime
    file says it was built for CUDA: a CPU engine is refused first, as one run on another kind of device.)"""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this libtorch has a GPU")
    engine, _ = _engine_with_runtime(aoti, tmp_path, _replace("device", "cuda"), reseal=True)
    code, stderr = _refused(wan_stream, engine, _inputs(aoti, tmp_path), tmp_path, "--device", "cuda")
    assert code == 1 and stderr == ("error: --device cuda: this libtorch has no CUDA device (a CPU-only build, or "
                                    "no GPU); use --device cpu"), stderr


@pytest.mark.parametrize("device", ["cuda", "cuda:1"])
def test_an_engine_run_on_another_kind_of_device_is_refused_naming_its_device(aoti, wan_stream, tmp_path, device):
    """A CPU package run with --device cuda (or a CUDA one with --device cpu) was not refused as Python refuses
    it: the runtime file named no device. It does now, and wan_stream refuses it before the libtorch's devices
    are judged (a CPU-only libtorch has no CUDA device either: that is not what is wrong)."""
    code, stderr = _refused(wan_stream, aoti[1], _inputs(aoti, tmp_path), tmp_path, "--device", device)
    assert code == 1 and stderr == (f"error: --engine {aoti[1]}: built for cpu, but asked to run on --device {device}; "
                                    "run it on cpu, or build one for cuda"), stderr


def test_a_tensorrt_plan_without_tensorrt_is_refused_saying_what_it_is(aoti, wan_stream, tmp_path):
    """A TensorRT plan given without --tensorrt went to AOTInductor's loader: libtorch's page-long error (exit 2).
    Refused on one line by the library's AotiRunner, saying what the file is and what to do."""
    plan = tensorrt_plan_stand_in(aoti[1], tmp_path / "plan")
    code, stderr = _refused(wan_stream, plan, _inputs(aoti, tmp_path), tmp_path)
    assert code == 1 and stderr == "error: " + TENSORRT_PLAN.format(plan), stderr


@pytest.mark.parametrize("device", [[], ["--device", "cpu"]])  # cpu is the default
def test_cuda_graphs_on_the_cpu_are_refused_before_any_work(wan_stream, tmp_path, device):
    """--cuda-graph --device cpu got as far as making the runner, which refused it only on a CPU-only libtorch
    (a CUDA one would capture CPU work). Refused before any file is read (here none exists)."""
    code, stderr = _refused(wan_stream, tmp_path / "engine.pt2", tmp_path / "in.pt", tmp_path, "--cuda-graph",
                            *device)
    assert code == 1 and stderr == "error: --cuda-graph: CUDA graphs need --device cuda (or cuda:N), not cpu", stderr


@pytest.mark.parametrize("flags, message", [
    (["--device", "cuda", "--cuda-graph"],
     "--tensorrt: the TensorRT runner captures no CUDA graphs; leave out --cuda-graph"),  # ran without them
    ([], "--tensorrt: a TensorRT engine runs on a CUDA device; give --device cuda, not cpu"),  # ran on cuda:0
    (["--device", "cpu"], "--tensorrt: a TensorRT engine runs on a CUDA device; give --device cuda, not cpu"),
    (["--device", "cuda:1"], "--tensorrt: the TensorRT runner runs on the current CUDA device (cuda:0); give "
                             "--device cuda, and pick the GPU with CUDA_VISIBLE_DEVICES, not --device cuda:1"),
])
def test_tensorrt_flags_its_runner_does_not_honour_are_refused_before_any_work(wan_stream, tmp_path, flags, message):
    """The TensorRT runner runs on the current CUDA device without CUDA graphs: --cuda-graph, --device cpu and
    --device cuda:N were dropped without a word. Refused before any file is read (here none exists), and before
    the refusal of a build without the TensorRT runner, which does not say what the flags could not do."""
    code, stderr = _refused(wan_stream, tmp_path / "engine.plan", tmp_path / "in.pt", tmp_path, "--tensorrt",
                            *flags)
    assert code == 1 and stderr == "error: " + message, stderr


@pytest.mark.parametrize("repeated, message", [
    (["--out", "{tmp}/a.pt", "--out", "{tmp}/b.pt"], "--out given twice ({tmp}/a.pt, {tmp}/b.pt): give it once"),
    (["--blocks", "1", "--blocks", "3"], "--blocks given twice (1, 3): give it once"),
    (["--seed", "1", "--seed", "2", "--seed", "1"], "--seed given 3 times (1, 2, 1): give it once"),
])
def test_a_value_flag_given_twice_is_refused(aoti, wan_stream, tmp_path, repeated, message):
    """The last of a repeated value flag was taken without a word: `--out a.pt --out b.pt` wrote b.pt only,
    `--blocks 1 --blocks 3` ran 3 blocks. Refused before any work, as `wan-trt` refuses an option given twice."""
    args = [a.format(tmp=tmp_path) for a in repeated]
    base = {"--blocks": "1", "--out": str(tmp_path / "out.pt")}
    flags = [x for flag, value in base.items() if flag not in repeated for x in (flag, value)]
    proc = subprocess.run([str(wan_stream), "--engine", str(aoti[1]), "--inputs", str(_inputs(aoti, tmp_path, 4)),
                           *flags, *args], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: " + message.format(tmp=tmp_path), proc.stderr
    assert "block 0" not in proc.stdout and sorted(p.name for p in tmp_path.iterdir()) == ["in.pt"]


def test_a_boolean_flag_repeated_means_it_once(aoti, wan_stream, tmp_path):
    """`--overwrite --overwrite` says the same as `--overwrite` (as `-vv` is taken by `wan-trt`)."""
    out = tmp_path / "out.pt"
    run = [str(wan_stream), "--engine", str(aoti[1]), "--inputs", str(_inputs(aoti, tmp_path)), "--blocks", "1",
           "--out", str(out)]
    first = subprocess.run(run, capture_output=True, text=True)  # an earlier output, replaced
    assert first.returncode == 0, first.stderr
    proc = subprocess.run(run + ["--overwrite", "--overwrite"], capture_output=True, text=True)
    assert proc.returncode == 0 and "block 0" in proc.stdout, proc.stderr
    assert torch.load(out).shape[2] == 3


@pytest.mark.parametrize("out, message", [
    ("/proc/out.pt", "--out /proc/out.pt: cannot be written (No such file or directory); give another path"),
    ("", "--out: an empty path; give a file path"),
])
def test_an_output_that_cannot_be_written_is_refused_before_any_block(aoti, wan_stream, tmp_path, out, message):
    """It was found only after every block had run (exit 1, the blocks' work lost), though refused up front is
    what wan_stream promises."""
    proc = subprocess.run([str(wan_stream), "--engine", str(aoti[1]), "--inputs", str(_inputs(aoti, tmp_path)),
                           "--blocks", "1", "--out", out], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: " + message, (proc.stdout, proc.stderr)
    assert "block 0" not in proc.stdout and sorted(p.name for p in tmp_path.iterdir()) == ["in.pt"]


# ---- the Python driver -------------------------------------------------------------------------------

def test_run_wan_stream_reports_an_error_whose_bytes_are_not_utf8(tmp_path):
    """wan_stream echoes paths, which may hold any bytes: their decoding raised UnicodeDecodeError in place of
    the error."""
    from wan_trt.engines.runtime.cpp import run_wan_stream
    from wan_trt.errors import WanTrtError
    exe = tmp_path / "wan_stream"
    exe.write_text("#!/bin/sh\nprintf 'error: --out /tmp/\\377.pt is a folder\\n' >&2\nexit 1\n")
    exe.chmod(0o755)
    with pytest.raises(WanTrtError, match="wan_stream failed \\(1\\): error: --out /tmp/\ufffd.pt is a folder"):
        run_wan_stream(exe, tmp_path / "e.pt2", tmp_path / "in.pt", 1, tmp_path / "out.pt")


def test_a_runtime_file_with_windows_line_endings_is_named_so(aoti, wan_stream, tmp_path):
    """A runtime file converted to CR LF was 'the runtime file of another kind of engine (wan_trt_runtime 5\\r),
    not wan_trt_runtime 5', a carriage return garbling the terminal's line."""
    engine, runtime = _engine_with_runtime(aoti, tmp_path, lambda lines: lines, reseal=False)
    runtime.write_bytes(runtime.read_bytes().replace(b"\n", b"\r\n"))
    code, stderr = _refused(wan_stream, engine, _inputs(aoti, tmp_path), tmp_path)
    assert code == 1 and stderr.startswith(f"error: {runtime}: its lines end in CR LF"), stderr
    assert "\r" not in stderr and "rebuild with `wan-trt build`" in stderr, stderr


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-qq", "-o", "/dev/null", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _strace_works(), reason="needs strace, allowed to trace (it holds the loader's open)")
def test_an_engine_replaced_between_its_verification_and_its_load_is_refused(aoti, wan_stream, tmp_path):
    """The runner verified the engine file (size, sha256) by its path, then the loader opened the path again: an
    engine a build installed meanwhile (by rename, as `wan-trt build` installs one) ran unverified. Here strace holds
    the loader's open (the third of the engine's path) for seconds while the test renames a copy into place: a file
    of the same bytes, which the runtime cannot tell from another engine (it never reads what the loader read)."""
    import time
    engine = tmp_path / "export" / aoti[1].name
    shutil.copytree(aoti[0], engine.parent, ignore=shutil.ignore_patterns("check"))
    inputs = _inputs(aoti, tmp_path)
    trace, out = tmp_path / "trace.log", tmp_path / "out.pt"
    proc = subprocess.Popen(["strace", "-f", "-qq", "-o", str(trace), "-P", str(engine), "-e", "trace=openat",
                             "-e", "inject=openat:delay_enter=4000000:when=3", str(wan_stream), "--engine", str(engine),
                             "--inputs", str(inputs), "--blocks", "1", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if trace.exists() and trace.read_text().count(str(engine)) >= 3:  # the third open is entered: held
            break
        time.sleep(0.05)
    assert trace.read_text().count(str(engine)) >= 3, trace.read_text()
    shutil.copy(engine, engine.with_name(".swap"))
    engine.with_name(".swap").rename(engine)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "was replaced or rewritten while it was verified and loaded" in stderr, \
        (proc.returncode, stdout, stderr)
    assert not out.exists()
