"""Three sections of the GPU check (scripts/gpu_check.py), each run as a child process with a
hard time budget: what is installed, the device's measured ceilings (CUDA events), and
whole-model decode (model_decode.py). Each writes its result as JSON to the path it is given,
models after every row, so a section killed at its budget keeps what it measured.

    python -u -m benchmarks.gpu_measure {environment,ceilings,models} --json PATH [--dry-run]"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

PACKAGES = ("torch", "triton", "transformers", "pytest", "grpcio", "protobuf", "tokenizers")
# Project dependencies the GPU machine need not have: nothing the check runs imports them
# (tests/unit/test_gpu_check.py runs the check with every package but torch, triton, pytest
# and transformers blocked: tests/unit/gpu_import_blocker.py).
NOT_NEEDED = (
    "grpc", "google.protobuf", "llguidance", "gguf", "prometheus_client", "opentelemetry",
    "grpc_health", "redis", "aiohttp",
)  # fmt: skip


def _absent(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is None
    except ModuleNotFoundError:  # its parent package is absent
        return True


def environment(dry_run: bool) -> dict:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    cuda = torch.cuda.is_available()
    if not dry_run and not cuda:
        raise RuntimeError("no CUDA device: use --dry-run to check the script on a CPU")
    return {
        "status": "ok",
        "device": torch.cuda.get_device_name() if cuda and not dry_run else "cpu (dry run)",
        "torch_cuda": torch.version.cuda,
        "packages": versions,
        "absent": [n for n in NOT_NEEDED if _absent(n)],
    }


def _device_seconds(fn, dry_run: bool, repeats: int) -> float:
    """Median seconds of fn: CUDA events on the GPU (after a warm-up), a clock on the CPU."""
    if dry_run:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def ceilings(dry_run: bool) -> dict:
    """Device-to-device copy GB/s (bytes read + written) and bf16 8192^3 matmul TFLOP/s."""
    device, dtype = ("cpu", torch.float32) if dry_run else ("cuda", torch.bfloat16)
    n = 1 << 12 if dry_run else 1 << 30  # 2 GiB of bf16: far past any cache
    src = torch.ones(n, dtype=dtype, device=device)
    dst = torch.empty_like(src)
    copy_s = _device_seconds(lambda: dst.copy_(src), dry_run, 20)
    m = 64 if dry_run else 8192
    a, b = (torch.randn(m, m, dtype=dtype, device=device) for _ in range(2))
    mm_s = _device_seconds(lambda: torch.matmul(a, b), dry_run, 20)
    return {
        "status": "ok",
        "copy_gbps": 2 * n * torch.empty((), dtype=dtype).element_size() / copy_s / 1e9,
        "copy_bytes": n * torch.empty((), dtype=dtype).element_size(),
        "matmul_tflops": 2 * m**3 / mm_s / 1e12,
        "matmul_shape": f"{m}x{m}x{m} {str(dtype).removeprefix('torch.')}",
    }


def models(dry_run: bool, copy_gbps: float, budget_s: float, save) -> dict:
    """SmolLM2's shape first (the goals are stated for it), then Llama 3.2 1B's while less
    than half of budget_s is spent. save(section) is called after every row."""
    from benchmarks import model_decode as md

    if dry_run:
        # One tiny model: both real shapes would map to the same TINY config.
        configs = {"tiny (stands for both)": md.TINY}
        work, dtype, device = md.Workload((1, 2), 8, 4), torch.float32, "cpu"
    else:
        configs = dict(md.SHAPES)
        # ~1k tokens of context by the end: the batch-64 goal is stated at 1k.
        work, dtype, device = md.Workload((1, 16, 64), 960, 64), torch.bfloat16, "cuda"
    section = {"status": "running", "rows": [], "notes": [], "dtype": str(dtype),
               "kernels": "triton"}  # fmt: skip
    started = time.perf_counter()

    def on_row(row: dict) -> None:
        section["rows"].append(row)
        save(section)

    for name, config in configs.items():
        if section["rows"] and time.perf_counter() - started > budget_s / 2:
            section["notes"].append(f"{name}: NOT RUN (half the section's budget spent)")
            continue
        try:
            md.measure(name, config, work, dtype, device, copy_gbps, on_row)
        except Exception as err:  # the other model still runs
            section["notes"].append(f"{name}: failed: {type(err).__name__}: {err}")
        if device == "cuda":
            torch.cuda.empty_cache()
    failed = [n for n in section["notes"] if "failed" in n]
    section["status"] = "failed: " + "; ".join(failed) if failed else "ok"
    return section


def _write_json(path: Path, data: dict) -> None:
    """Atomically: a section killed mid-write leaves the previous version."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_measure")
    p.add_argument("section", choices=("environment", "ceilings", "models"))
    p.add_argument("--json", required=True, type=Path, help="where the result goes")
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--copy-gbps", type=float, default=float("nan"), help="models: MBU's base")
    p.add_argument("--budget-s", type=float, default=120.0, help="models: the hard budget")
    args = p.parse_args(argv)
    save = lambda section: _write_json(args.json, section)  # noqa: E731
    if args.section == "environment":
        result = environment(args.dry_run)
    elif args.section == "ceilings":
        result = ceilings(args.dry_run)
    else:
        result = models(args.dry_run, args.copy_gbps, args.budget_s, save)
    save(result)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, default=str))
    return 0 if not str(result.get("status", "")).startswith("failed") else 1


if __name__ == "__main__":
    sys.exit(main())
