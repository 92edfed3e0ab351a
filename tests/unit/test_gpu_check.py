"""The GPU check's dry run (scripts/gpu_check.py --dry-run: tiny shapes, CPU, Triton's
interpreter) runs every section and writes report.md and report.json with all of them, so a
run on a rented GPU never dies of a typo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("environment", "tests", "ceilings", "attention", "small_ops", "models")


def test_dry_run_writes_every_section(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_INTERPRET="1")
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--out", str(tmp_path), "--dry-run"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    markdown = (tmp_path / "report.md").read_text()
    for name in SECTIONS:
        assert not report[name]["status"].startswith("failed"), (name, report[name])
        assert f"## {name}" in markdown
    assert report["tests"]["status"].startswith(("collected only", "NOT RUN"))
    kinds = {next(iter(row.values())) for row in report["attention"]["rows"]}
    assert kinds == {"decode", "prefill"}
    assert {row["op"] for row in report["small_ops"]["rows"]} >= {"rms_norm", "rope"}
    models = {row["model"] for row in report["models"]["rows"]}
    assert models == {"smollm2-135m (tiny)", "llama-3.2-1b (tiny)"}
    for row in report["models"]["rows"]:
        assert row["ours_decode_tok_s"] > 0 and row["mbu"] > 0
    assert "| smollm2-135m (tiny) | 2 |" in markdown
