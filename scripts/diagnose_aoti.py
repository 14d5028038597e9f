#!/usr/bin/env python3
"""Where does an AOTInductor package crash on this machine? Each step runs in its own process.

    python scripts/diagnose_aoti.py --out bench/results/aoti_diagnosis_<gpu>.json [--package PKG ...]

Steps: a tiny CUDA model (Linear + GELU) compiled and packaged with the default options and with
variants of the package options, then loaded and run in a fresh process (plain torch, no wan_trt
import), and again after importing wan_trt; then every --package given (e.g. a `wan-trt build
--backend aoti` engine), loaded the same way. A step that dies records its signal and the tail of
its stderr (Python faulthandler stack, and a native backtrace when gdb is on the machine).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BUILD = r"""
import sys, torch
opts = eval(sys.argv[2])
dev = sys.argv[3]
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).to(dev)
x = torch.randn(8, 256, device=dev)
program = torch.export.export(model, (x,))
torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[1], inductor_configs=opts)
print("built", sys.argv[1])
"""

LOAD = r"""
import ctypes, subprocess, sys, faulthandler
faulthandler.enable()
mode = sys.argv[2]
if mode.startswith("global_libstdcxx"):  # the compiler's libstdc++ in the global scope, before/after torch
    lib = subprocess.run(["c++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout.strip()
    if mode.endswith("before"):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    import torch
    if mode.endswith("after"):
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
import torch
if mode == "wan_trt":
    import wan_trt.cli, wan_trt.engines.session  # noqa: F401  everything the CLI imports
if mode == "cuda_first":
    torch.zeros(1, device="cuda")  # CUDA context (and its libraries) up before the loader
dev = "cpu" if "cpu" in sys.argv[1] else "cuda"
print("loading", sys.argv[1], flush=True)
if mode in ("direct_runner", "dlopen"):  # the extracted .so without the package loader
    import ctypes, glob, subprocess, tempfile, zipfile
    root = tempfile.mkdtemp()
    zipfile.ZipFile(sys.argv[1]).extractall(root)
    so = glob.glob(root + "/**/*.so", recursive=True)[0]
    print("so", so, flush=True)
    print(subprocess.run(["ldd", so], capture_output=True, text=True).stdout, flush=True)
    if mode == "dlopen":
        ctypes.CDLL(so)
        print("dlopen ok", flush=True)
        sys.exit(0)
    if dev == "cpu":
        inner = torch._C._aoti.AOTIModelContainerRunnerCpu(so, 1)
    else:
        inner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, "cuda", str(__import__("pathlib").Path(so).parent))
    runner = lambda *xs: inner.run(list(xs))  # noqa: E731
else:
    runner = torch._inductor.aoti_load_package(sys.argv[1])
print("loaded", flush=True)
if len(sys.argv) > 3:  # a wan-trt engine: feed it the sample inputs of its export's spec
    from wan_trt.export.manifest import Manifest
    spec = Manifest.read(sys.argv[3]).spec
    feeds = spec.sample_inputs(device="cuda")
    outs = runner(*(feeds[n] for n in spec.input_names))
else:
    outs = runner(torch.randn(8, 256, device=dev))
outs = outs if isinstance(outs, (list, tuple)) else [outs]
if dev == "cuda":
    torch.cuda.synchronize()
print("ran", [tuple(o.shape) for o in outs], flush=True)
"""

# (device, package options, how to load)
STEPS = {
    "cpu": ("cpu", {}, ["plain", "global_libstdcxx_before", "global_libstdcxx_after", "ld_preload_libstdcxx"]),
    "cuda": ("cuda", {}, ["plain", "global_libstdcxx_before", "global_libstdcxx_after", "ld_preload_libstdcxx"]),
    "cpu_no_as_needed": ("cpu", {}, ["plain", "dlopen"]),  # linked with every library kept (CXX wrapper)
    "cuda_no_as_needed": ("cuda", {}, ["plain"]),
}


LIBSTDCXX = subprocess.run(["c++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout.strip()


def run(cmd: list[str], timeout: int = 600, gdb: bool = False, env: dict | None = None) -> dict:
    debugger = shutil.which("gdb") or shutil.which("cuda-gdb") or "/usr/local/cuda/bin/cuda-gdb"
    if gdb and Path(debugger).exists():
        cmd = [debugger, "-q", "-batch", "-ex", "set pagination off", "-ex", "run", "-ex", "bt 30", "--args"] + cmd
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=None if env is None else {**os.environ, **env})
        return {"rc": proc.returncode, "stdout": proc.stdout[-6000:], "stderr": proc.stderr[-3000:]}
    except subprocess.TimeoutExpired:
        return {"rc": "timeout"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--gdb", action="store_true", help="also load the tiny CUDA package under (cuda-)gdb")
    p.add_argument("--only", nargs="*", help=f"steps among {list(STEPS)}")
    p.add_argument("--package", nargs="*", default=[], help="engine.pt2 files (their export dir is the parent)")
    args = p.parse_args()
    import torch
    result = {"command": " ".join(["python3", "scripts/diagnose_aoti.py"] + sys.argv[1:]), "torch": torch.__version__, "cuda": torch.version.cuda,
              "cxx": subprocess.run(["c++", "--version"], capture_output=True, text=True).stdout.splitlines()[:1], "gdb": shutil.which("gdb"),
              "device": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "steps": {}}

    def record(name: str, value: dict) -> None:
        result["steps"][name] = value
        print(name, value.get("rc"), (value.get("stdout") or "").strip().splitlines()[-1:], flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))

    work = Path(tempfile.mkdtemp(prefix="aoti_diag_"))
    wrapper = work / "cxx_no_as_needed"
    wrapper.write_text('#!/bin/sh\ncase " $* " in *" -shared "*) exec c++ -Wl,--no-as-needed "$@";; esac\n'
                       'exec c++ "$@"\n')
    wrapper.chmod(0o755)
    torch_lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    for sym in ("_ZNSt6locale", "_ZNSt5ctypeIcE2idE", "GLIBCXX_3.4"):  # does libtorch carry its own libstdc++?
        nm = subprocess.run(f"nm -D --defined-only {torch_lib} | grep -c {sym}", shell=True, capture_output=True,
                            text=True).stdout.strip()
        result[f"libtorch_cpu_defines_{sym}"] = nm
    result["libtorch_cpu_needed"] = subprocess.run(f"readelf -d {torch_lib} | grep NEEDED", shell=True,
                                                   capture_output=True, text=True).stdout
    for name, (device, opts, modes) in STEPS.items():
        if args.only and name not in args.only:
            continue
        pkg = work / f"tiny_{name}.pt2"
        env = {"CXX": str(wrapper)} if name.endswith("no_as_needed") else None
        record(f"tiny_{name}_build", run([sys.executable, "-c", BUILD, str(pkg), repr(opts), device], env=env))
        for mode in modes if pkg.exists() else []:
            env = {"LD_PRELOAD": LIBSTDCXX} if mode == "ld_preload_libstdcxx" else None
            record(f"tiny_{name}_load_{mode}", run([sys.executable, "-c", LOAD, str(pkg), mode], env=env))
    if args.gdb and (work / "tiny_cpu.pt2").exists():
        record("tiny_cpu_load_gdb", run([sys.executable, "-c", LOAD, str(work / "tiny_cpu.pt2"), "direct_runner"],
                                        gdb=True, timeout=240))
    for package in args.package:
        pkg = Path(package)
        for mode in ("cuda_first", "direct_runner"):
            record(f"{pkg.parent.name}/{pkg.name}_load_{mode}",
                   run([sys.executable, "-c", LOAD, str(pkg), mode, str(pkg.parent)]))


if __name__ == "__main__":
    main()
