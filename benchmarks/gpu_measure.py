"""The in-process parts of the GPU check (scripts/gpu_check.py): what is installed, the
device's measured ceilings (CUDA events), and whole-model decode (model_decode.py)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time

import torch

MODEL_BUDGET_S = 110  # larger batches are skipped (and said so) once this is spent
PACKAGES = ("torch", "triton", "transformers", "pytest", "grpcio", "protobuf", "tokenizers")
# Project dependencies the GPU machine need not have: nothing the check runs imports them
# (tests/unit/test_gpu_check.py collects the check's tests with them blocked).
NOT_NEEDED = ("gguf", "prometheus_client", "opentelemetry", "grpc_health", "redis", "aiohttp")


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
        "absent": [n for n in NOT_NEEDED if importlib.util.find_spec(n) is None],
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


def models(dry_run: bool, ceilings_result: dict) -> dict:
    from benchmarks import model_decode as md

    if dry_run:
        # One tiny model: both real shapes would map to the same TINY config.
        configs = {"tiny (stands for both)": md.TINY}
        work, dtype, device = md.Workload((1, 2), 8, 4), torch.float32, "cpu"
    else:
        configs = dict(md.SHAPES)
        # ~1k tokens of context by the end: the batch-64 goal is stated at 1k.
        work, dtype, device = md.Workload((1, 16, 64), 960, 64), torch.bfloat16, "cuda"
    copy_gbps = ceilings_result.get("copy_gbps") or float("nan")
    rows, notes, started = [], [], time.perf_counter()
    for name, config in configs.items():
        batches = work.batches
        if time.perf_counter() - started > MODEL_BUDGET_S:
            batches = work.batches[:1]
            notes.append(f"{name}: time budget spent, only batch {batches[0]}")
        one = md.Workload(batches, work.prompt_len, work.new_tokens)
        try:
            rows += md.measure(name, config, one, dtype, device, copy_gbps)
        except Exception as err:  # the other model still runs
            notes.append(f"{name}: failed: {type(err).__name__}: {err}")
        if device == "cuda":
            torch.cuda.empty_cache()
    failed = any("failed" in n for n in notes)
    status = "failed: " + "; ".join(notes) if failed else "ok"
    return {
        "status": status,
        "rows": rows,
        "notes": notes,
        "dtype": str(dtype),
        "kernels": "triton",
    }
