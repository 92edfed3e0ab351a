"""The attention benchmark's dry run works without a GPU: both kernels run under the
interpreter at tiny shapes and agree with torch (the script exits 1 when they do not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_runs_both_kernels_and_agrees() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.kernels.attention", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines() if "| 64 |" in line]
    assert rows.count("decode") == 4  # batch {1, 3} x context {16, 48}
    assert rows.count("prefill") == 2  # length {16, 40}
