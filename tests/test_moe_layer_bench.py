"""bench/moe_layer.py's one-GPU rows of Halo's EP path run on the CPU and check themselves against the
full layer (the script exits non-zero when a row disagrees)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts ranks or runs: left out of the fast tier (README)

ROOT = Path(__file__).resolve().parents[1]


def test_halo_rows_run_and_agree_with_the_full_layer(tmp_path):
    out = tmp_path / "rows.json"
    command = [sys.executable, str(ROOT / "bench" / "moe_layer.py"), "--tiny", "--tokens", "48", "--warmup", "1", "--steps", "2",
               "--implementations", "grouped_mm", "halo_local", "halo_loopback", "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["transformers grouped_mm", "halo_local", "halo_loopback"]
    assert all(r["median_ms"] > 0 for r in rows)
