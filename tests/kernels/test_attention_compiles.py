"""The attention kernels compile for a Hopper GPU, checked on any machine (no device needed):
every dtype the worker runs them in (fp32, fp16, bf16) at the tiles the host wrappers pick on
CUDA, with no register spills and shared memory within an H100/H200 block's 227 KB.

The CPU tests run the kernels in the interpreter, which accepts code the GPU compiler rejects
and knows nothing of registers; tests/kernels/attention_sm90.py compiles each variant with
Triton's ptxas in a process of its own (this one may have TRITON_INTERPRET=1 set). The fast
set runs here (compiles are cached in Triton's cache, so a rerun takes seconds); the sweep
over GQA groups 1-8, every page size and every reduction width runs with
LAYERSERVE_AOT_SWEEP=1 (minutes): python -m tests.kernels.attention_sm90 --all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _compile(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.attention_sm90", *args],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if line.startswith("| ") and "|" in line]


def _variants(rows: list[str]) -> list[list[str]]:
    """The cells of each variant row (header and rule left out)."""
    cells = [[c.strip() for c in row.strip("| ").split("|")] for row in rows]
    return [c for c in cells if c[0] not in ("variant", "---")]


def test_every_dtype_compiles_for_sm90_without_spills() -> None:
    rows = _variants(_compile())
    assert all(row[-1] == "ok" for row in rows), rows
    kinds = {(row[0].split()[0], row[0].split()[1]) for row in rows}
    assert kinds == {
        (k, d) for k in ("decode", "prefill", "reduce") for d in ("fp32", "fp16", "bf16")
    }
    assert sum("decode" in row[0] for row in rows) == 3 * 2 * 2  # dtypes x D x split or not
    assert all(row[3] == "0/0" for row in rows)  # spill store/load bytes


@pytest.mark.skipif(
    os.environ.get("LAYERSERVE_AOT_SWEEP") != "1", reason="the full sweep: LAYERSERVE_AOT_SWEEP=1"
)
def test_every_launchable_variant_compiles_for_sm90_without_spills() -> None:
    rows = _variants(_compile("--all"))
    assert rows and all(row[-1] == "ok" for row in rows), [r for r in rows if r[-1] != "ok"]
    labels = " ".join(row[0] for row in rows)
    for group in range(1, 9):
        assert f"G={group} page=16" in labels
    for page in (1, 16, 256):
        assert f"G=1 page={page}" in labels
    for pad in (2, 4, 8, 16, 32, 64):
        assert f"splits<={pad}" in labels
