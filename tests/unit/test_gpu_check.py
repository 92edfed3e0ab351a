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
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=420,
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
    rows = report["models"]["rows"]
    assert {(row["mode"], row["batch"]) for row in rows} == {
        (mode, batch) for mode in ("eager", "cuda graphs") for batch in (1, 2)
    }
    for row in rows:
        assert row["ours_decode_tok_s"] > 0 and row["mbu"] > 0
    assert "| tiny (stands for both) | cuda graphs | 2 |" in markdown


def test_the_checks_tests_and_models_need_no_other_project_packages() -> None:
    """With gguf, prometheus_client, opentelemetry, ... unimportable, the tests the GPU check
    runs are still collected and the whole-model runner still imports."""
    from scripts.gpu_check import GPU_TESTS

    collect = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p",
         "tests.unit.gpu_import_blocker", *GPU_TESTS],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert collect.returncode == 0, collect.stdout[-3000:] + collect.stderr[-2000:]
    assert " tests collected" in collect.stdout
    code = (
        "import tests.unit.gpu_import_blocker, services.worker.engine.model_runner, "
        "benchmarks.model_decode, benchmarks.gpu_measure"
    )
    imports = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert imports.returncode == 0, imports.stderr[-2000:]
