"""The GPU check (scripts/gpu_check.py) cannot trip on itself on a bare GPU machine: its
sections' hard budgets fit the run in 8 minutes with a margin, a section past its budget is
killed and fails with its output kept, report.md ends with a verdict row per goal, and the
whole dry run (tiny shapes, CPU, Triton's interpreter) passes with every package but torch,
triton, pytest and transformers unimportable, grpc, protobuf and the generated stubs
included (tests/unit/gpu_import_blocker.py, loaded into every process through
sitecustomize). That dry run is also the suite's check of the kernel benchmarks' own dry runs
(attention, small ops): every shape runs and agrees with torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu_report import render
from benchmarks.gpu_verdicts import GOALS, verdicts
from scripts import gpu_check

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT_S = 8 * 60
MARGIN_S = 60  # for the parent's own work and a machine slower than planned
SMALL_OPS = ("rms_norm", "add_rms_norm", "silu_mul", "rope", "cache_write")


def test_budgets_fit_eight_minutes_with_a_margin() -> None:
    assert set(gpu_check.BUDGETS_S) == set(gpu_check.SECTIONS)
    assert all(budget > 0 for budget in gpu_check.BUDGETS_S.values())
    assert gpu_check.TOTAL_BUDGET_S == sum(gpu_check.BUDGETS_S.values())
    assert gpu_check.TOTAL_BUDGET_S <= RUN_LIMIT_S - MARGIN_S


def test_a_section_past_its_budget_is_killed_fails_and_keeps_its_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(gpu_check.BUDGETS_S, "attention", 2)
    code = "import subprocess, sys, time; print('| a |\\n| --- |\\n| 1 |'); " + (
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    started = time.perf_counter()
    result = gpu_check.run_child("attention", ["-c", code], tmp_path, dry_run=True)
    assert time.perf_counter() - started < 10
    assert result["status"].startswith("FAIL: timeout")
    assert "| 1 |" in result["stdout"]  # printed before the kill: unbuffered
    assert gpu_check.failed(result)


def test_a_table_section_runs_its_module_and_keeps_its_tables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How a section joins (the 4-bit kernels' is to): one TABLE_SECTIONS entry, one budget."""
    code = "print('| op | GB/s |'); print('| --- | --- |'); print('| int4 | 12 |')"
    section = gpu_check.TableSection(("-c", "raise SystemExit(1)"), ("-c", code))
    monkeypatch.setitem(gpu_check.TABLE_SECTIONS, "int4", section)
    monkeypatch.setitem(gpu_check.BUDGETS_S, "int4", 20)
    args = gpu_check.parse(["--out", str(tmp_path), "--dry-run"])
    result = gpu_check.run_section("int4", args, {})
    assert result["status"] == "passed" and result["rows"] == [{"op": "int4", "GB/s": "12"}]
    assert "## int4" in render({"dry_run": True, "int4": result, "verdicts": []})
    missing = gpu_check.TableSection(("-c", code), ("-c", code), needs=("no_such_package_x",))
    monkeypatch.setitem(gpu_check.TABLE_SECTIONS, "int4", missing)
    result = gpu_check.run_section("int4", args, {})
    assert result["status"] == "not run (no_such_package_x not installed here)"
    assert not gpu_check.failed(result)


def test_every_table_section_has_a_budget() -> None:
    assert set(gpu_check.TABLE_SECTIONS) <= set(gpu_check.SECTIONS)


def _report(**sections: dict) -> dict:
    report = {"dry_run": False, **sections}
    report["verdicts"] = verdicts(report)
    return report


def _verdict_rows(markdown: str) -> list[list[str]]:
    lines = markdown.strip().splitlines()
    table = lines[lines.index("| goal | target | measured | verdict |") :]
    assert len(table) == 2 + len(GOALS), "the verdict table is not the end of report.md"
    return [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]


def test_report_ends_with_one_verdict_per_goal() -> None:
    attention_rows = [
        {"decode": "decode", "batch": "64", "context": "8192", "D": "128", "kernel GB/s": "3500"},
        {"decode": "decode", "batch": "1", "context": "512", "D": "64", "kernel GB/s": "100"},
        {"prefill": "prefill", "seq len": "1024", "D": "64", "kernel TFLOP/s": "300",
         "SDPA TFLOP/s": "400"},
    ]  # fmt: skip
    model = {"model": "smollm2-135m", "greedy_same_as_hf": "1/1", "ours_decode_tok_s": 1500.0,
             "mbu": 0.3}  # fmt: skip
    models = [
        {**model, "batch": 1, "mode": "cuda graphs"},
        {**model, "batch": 64, "mode": "cuda graphs", "greedy_same_as_hf": "63/64"},
    ]
    report = _report(
        ceilings={"status": "passed", "copy_gbps": 4000.0, "copy_bytes": 2**31,
                  "matmul_shape": "8192^3 bf16", "matmul_tflops": 700.0},
        attention={"status": "passed", "rows": attention_rows},
        models={"status": "passed", "rows": models},
    )  # fmt: skip
    rows = _verdict_rows(render(report))
    assert [row[0] for row in rows] == [goal.name for goal in GOALS]
    verdict = {row[0]: (row[2], row[3]) for row in rows}
    assert verdict["decode attention"] == ("88% of 4000 GB/s (batch 64 x 8192, D=128)", "PASS")
    assert verdict["prefill attention"][1] == "FAIL"  # 0.75x
    assert verdict["SmolLM2 batch 1"] == ("1,500 tok/s (cuda graphs)", "PASS")
    assert verdict["SmolLM2 batch 64"][1] == "FAIL"  # 30%
    assert verdict["greedy output"] == ("64/65 sequences identical (2 rows)", "FAIL")


def test_verdicts_say_not_run_and_timeout() -> None:
    report = _report(
        attention={"status": "FAIL: timeout (killed at its 75s budget)", "rows": []},
        models={"status": "failed (rc 1)", "rows": []},
    )
    verdict = {row[0]: (row[2], row[3]) for row in _verdict_rows(render(report))}
    assert verdict["decode attention"] == ("-", "FAIL: timeout")
    assert verdict["prefill attention"] == ("-", "FAIL: timeout")
    assert verdict["SmolLM2 batch 1"][1] == "FAIL"
    assert _verdict_rows(render(_report()))[0][3] == "not run"


def _bare_machine(tmp_path: Path) -> dict[str, str]:
    """An environment whose python processes import the blocker first (sitecustomize)."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import tests.unit.gpu_import_blocker  # noqa: F401\n")
    path = os.pathsep.join([str(site), str(ROOT)])
    return dict(os.environ, PYTHONPATH=path, TRITON_INTERPRET="1")


def test_the_compute_path_imports_no_grpc_protobuf_or_stubs(tmp_path: Path) -> None:
    code = """
import importlib, sys
for blocked in ("grpc", "google.protobuf", "layerserve.common.v1.common_pb2", "llguidance"):
    try:
        importlib.import_module(blocked)
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(f"{blocked} was importable: the blocker does not block it")
import services.worker.engine.model_runner, services.worker.layers.triton_attention
import services.worker.engine.decode_graphs, services.worker.engine.sampler
import services.worker.model.llama, services.common.errors, services.common.sampling
import benchmarks.model_decode, benchmarks.gpu_measure, benchmarks.kernels.attention
import scripts.gpu_check
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_bare_machine(tmp_path),
                          capture_output=True, text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def test_dry_run_passes_on_a_bare_machine(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--out", str(out), "--dry-run"],
        cwd=ROOT, env=_bare_machine(tmp_path), capture_output=True, text=True,
        timeout=gpu_check.TOTAL_BUDGET_S + 60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    markdown = (out / "report.md").read_text()
    for name in gpu_check.SECTIONS:
        assert not gpu_check.failed(report[name]), (name, report[name].get("stdout", "")[-2000:])
        assert f"## {name}" in markdown
    assert report["tests"]["status"] == "collected only (dry run): passed"
    assert " tests collected" in report["tests"]["stdout"]
    assert {"grpc", "google.protobuf", "llguidance"} <= set(report["environment"]["absent"])
    # The kernel benchmarks' dry runs (the suite's only run of them): every tiny shape, each
    # kernel agreeing with torch (a disagreement exits 1, a failed section above).
    # Decode at batch {1, 3} x context {16, 48}, prefill at length {16, 40}, all at D=64.
    attention = sorted((next(iter(row)), row["D"]) for row in report["attention"]["rows"])
    assert attention == [("decode", "64")] * 4 + [("prefill", "64")] * 2
    small_ops = sorted((row["op"], row["tokens"]) for row in report["small_ops"]["rows"])
    assert small_ops == sorted((op, n) for op in SMALL_OPS for n in ("1", "3"))
    assert {(r["mode"], r["batch"]) for r in report["models"]["rows"]} == {
        (mode, batch) for mode in ("eager", "cuda graphs") for batch in (1, 2)
    }
    rows = _verdict_rows(markdown)
    assert [row[3] for row in rows] == ["dry run"] * len(GOALS), rows  # each with its figure
    # the real model's reader is not on a bare machine: the section says so, and fails nothing
    assert report["speculation"]["status"].startswith("not run (gguf")
    assert {row["shape"] for row in report["int4"]["rows"]} == {"96x64", "64x96"}
