"""The full-size export must fit a 24 GB CI machine (slow: ~6 min on 2 cores)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_full_universal_export_stays_within_the_machine(tmp_path):
    out = tmp_path / "guard.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "guard_export_memory.py"), "--config", "universal",
                           "--precision", "bf16", "--limit-gib", "20", "--out", str(out)])
    result = json.loads(out.read_text())
    assert proc.returncode == 0 and result["peak_rss_gib"] < 20, result
