"""One script for a GPU machine with no network: kernel tests on CUDA, the device's measured
ceilings, the attention and small-op kernel benchmarks, and whole-model decode against Hugging
Face, written as report.md and report.json to an output folder.

    make gpu-check OUT=/path          # PYTHONPATH=. python3 scripts/gpu_check.py --out /path
    python3 scripts/gpu_check.py --out /tmp/x --dry-run   # tiny shapes, CPU, interpreter, fp32

Needs only torch, triton (and transformers for the HF baseline, pytest for the tests); packages
the worker's loaders and servers import (gguf, prometheus_client, ...) are never imported. Each
section is written out as soon as it ends, so a run cut short still leaves what it measured;
a part that could not run says NOT RUN, never passed."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("environment", "tests", "ceilings", "attention", "small_ops", "models")
# What pytest runs on CUDA. Deselected: the one test that starts the worker's gRPC servicer,
# which needs packages (prometheus_client, grpc_health) the GPU machine does not have.
GPU_TESTS = (
    "-k", "not describe_reports_kernels", "tests/kernels",
    "tests/unit/worker/test_triton_engine.py", "tests/unit/worker/test_decode_graphs.py",
)  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/gpu_check.py")
    p.add_argument("--out", required=True, help="folder for report.md and report.json")
    p.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU (interpreter)")
    p.add_argument("--skip-tests", action="store_true", help="do not run pytest")
    return p.parse_args(argv)


def child_env(dry_run: bool) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    if dry_run:
        env["TRITON_INTERPRET"] = "1"
    return env


def run_child(args: list[str], dry_run: bool, timeout_s: float) -> dict:
    """A python -m subprocess in the repository root; its output kept whatever happens."""
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=child_env(dry_run), capture_output=True,
            text=True, timeout=timeout_s,
        )  # fmt: skip
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out, err = None, _text(exc.stdout), _text(exc.stderr) + f"\ntimed out at {timeout_s}s"
    status = "passed" if rc == 0 else ("timed out" if rc is None else f"failed (rc {rc})")
    return {
        "status": status, "seconds": round(time.perf_counter() - started, 1),
        "command": " ".join(["python", *args]), "stdout": out, "stderr_tail": err[-3000:],
    }  # fmt: skip


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def tests_section(args: argparse.Namespace) -> dict:
    if args.skip_tests:
        return {"status": "NOT RUN (--skip-tests)"}
    if importlib.util.find_spec("pytest") is None:
        print("pytest is not installed: the kernel tests are NOT RUN", file=sys.stderr)
        return {"status": "NOT RUN (pytest is not installed)"}
    pytest_args = ["-m", "pytest", "-q", *GPU_TESTS]
    if args.dry_run:  # proves the command and the collection; running them is the GPU's job
        result = run_child([*pytest_args, "--collect-only"], True, 120)
        result["status"] = f"collected only (dry run): {result['status']}"
        return result
    return run_child(pytest_args, False, 170)


def markdown_tables(text: str) -> list[dict]:
    """The rows of every markdown table in a benchmark's output, as dicts by header."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif set("".join(cells)) <= set("- "):
            continue
        else:
            rows.append(dict(zip(header, cells, strict=False)))
    return rows


def bench_section(module: str, args: argparse.Namespace, timeout_s: float) -> dict:
    result = run_child(["-m", module, *(["--dry-run"] if args.dry_run else [])], args.dry_run,
                       timeout_s)  # fmt: skip
    result["rows"] = markdown_tables(result["stdout"])
    return result


def with_check_copy(section: dict, ceilings: dict) -> dict:
    """Decode rows also as a share of the copy bandwidth this script measured (MBU's base)."""
    copy = ceilings.get("copy_gbps")
    for row in section.get("rows", []):
        if copy and row.get("decode") == "decode" and "kernel GB/s" in row:
            row["kernel % of check copy"] = round(100 * float(row["kernel GB/s"]) / copy, 1)
    return section


def write(out: Path, report: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    from benchmarks.gpu_report import render

    (out / "report.md").write_text(render(report))


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports a kernel
    sys.path.insert(0, str(ROOT))
    from benchmarks import gpu_measure

    out, started = Path(args.out), time.perf_counter()
    report: dict = {"dry_run": args.dry_run}
    steps = {
        "environment": lambda: gpu_measure.environment(args.dry_run),
        "tests": lambda: tests_section(args),
        "ceilings": lambda: gpu_measure.ceilings(args.dry_run),
        "attention": lambda: with_check_copy(
            bench_section("benchmarks.kernels.attention", args, 110), report["ceilings"]
        ),
        "small_ops": lambda: bench_section("benchmarks.kernels.small_ops", args, 60),
        "models": lambda: gpu_measure.models(args.dry_run, report["ceilings"]),
    }
    for name in SECTIONS:
        section_started = time.perf_counter()
        print(f"== {name} ...", flush=True)
        try:
            report[name] = steps[name]()
        except Exception as err:  # one broken section must not lose the others
            report[name] = {"status": f"failed: {type(err).__name__}: {err}"}
        report[name].setdefault("seconds", round(time.perf_counter() - section_started, 1))
        print(f"   {report[name].get('status', 'done')} ({report[name]['seconds']}s)", flush=True)
        write(out, report)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    write(out, report)
    print(f"wrote {out / 'report.md'} and report.json in {report['total_seconds']}s")
    failed = [n for n in SECTIONS if str(report[n].get("status", "")).startswith("failed")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
