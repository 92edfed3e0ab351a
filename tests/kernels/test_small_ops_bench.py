"""The small-ops benchmark's dry run works on a machine without a GPU: every op runs under the
interpreter and agrees with its torch reference."""

from __future__ import annotations

import subprocess
import sys

OPS = ("rms_norm", "add_rms_norm", "silu_mul", "rope", "cache_write")


def test_dry_run_runs_every_op_and_agrees() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.kernels.small_ops", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line.split("|")[1].strip() for line in result.stdout.splitlines()[2:]]
    assert sorted(rows) == sorted(OPS * 2)  # each op at 1 and 3 tokens
