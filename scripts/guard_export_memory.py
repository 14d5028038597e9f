#!/usr/bin/env python3
"""Export a config in a child process and check its peak memory stays within the machine.

    python scripts/guard_export_memory.py --config universal --precision bf16 --limit-gib 20 \
        --out bench/results/export_universal_bf16_cpu.json

Runs ``wan-trt export`` (to a temporary directory unless --keep DIR), records wall time and
the child's peak resident memory (ru_maxrss), writes them as JSON and exits 1 when the peak
is over --limit-gib (CI machines have 24 GB).
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from wan_trt.profiling import provenance, write_result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="universal")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--limit-gib", type=float, default=20.0)
    p.add_argument("--keep", type=Path, default=None, help="export here and keep it")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    target = args.keep or Path(tempfile.mkdtemp()) / "export"
    cmd = [sys.executable, "-m", "wan_trt.cli", "export", "--config", args.config, "--precision", args.precision,
           "--out", str(target), "--overwrite"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - start
    peak_gib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2 ** 20  # KiB on Linux
    sizes = {f.name: f.stat().st_size for f in target.iterdir()} if target.is_dir() else {}
    result = {**provenance(device="cpu"), "export_command": " ".join(cmd[2:]), "returncode": proc.returncode, "wall_s": wall,
              "peak_rss_gib": peak_gib, "limit_gib": args.limit_gib, "files_bytes": sizes,
              "stages": [line for line in proc.stderr.splitlines() if line.startswith("[wan-trt]")]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_result(args.out, result, indent=2)
    if args.keep is None:
        shutil.rmtree(target.parent, ignore_errors=True)
    print(json.dumps({k: result[k] for k in ("returncode", "wall_s", "peak_rss_gib", "limit_gib")}))
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return 1
    return 0 if peak_gib <= args.limit_gib else 1


if __name__ == "__main__":
    sys.exit(main())
