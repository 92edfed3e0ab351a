"""What a benchmark ran on, recorded in every report: versions, threads, load, and the
ceilings (copy bandwidth, fp32 matmul) measured at the start of the same run."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable
from importlib import metadata

import torch


def machine() -> dict:
    """Versions and the machine; load averages say how much else was running."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "triton": _version("triton"),
        "layerserve_commit": _commit(),
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor() or "unknown",
        "cpu_model": _cpu_model(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "cpu_extension": cpu_extension(),
        "load_average": load_average(),
    }


def cpu_extension() -> str:
    """Whether the worker's C++ CPU kernels (services/worker/layers/csrc) are built for this
    source and CPU. Without them a CPU run falls back to torch's ops, several times slower (a
    grounded batch-1 decode: 22 tok/s against 72), so a figure says which it had."""
    from services.worker.layers import cpu_attention_ext

    if cpu_attention_ext.library_path().exists():
        return "built"
    return "not built: torch's ops instead"


def load_average() -> list[float]:
    """1, 5 and 15-minute load averages, rounded; other work sharing the cores shows here."""
    return [round(x, 2) for x in os.getloadavg()]


# A 1-minute load above half the cores means at least that much other work wanted the CPU
# when the run began: on the 2-core box one busy core already halves what a 2-thread engine
# gets, and 1-thread figures taken beside it swing by 2x and more (docs/benchmarks.md).
BUSY_LOAD_PER_CPU = 0.5


def busy_reason(load_1min: float, cpus: int, per_cpu: float = BUSY_LOAD_PER_CPU) -> str | None:
    """Why the machine counts as busy (the 1-minute load average above `per_cpu` x cores), or
    None when it is quiet enough to measure."""
    limit = per_cpu * cpus
    if load_1min <= limit:
        return None
    return (
        f"the 1-minute load average was {load_1min:.2f} at the start, above {limit:g} "
        f"({per_cpu:g} x {cpus} cores)"
    )


def ceilings() -> dict:
    """What this machine can do at best, measured now: copy bandwidth and fp32 matmul."""
    x = torch.empty(64 * 2**20 // 4, dtype=torch.float32).fill_(1.0)  # 64 MiB
    y = torch.empty_like(x)
    best_copy = min(_time(lambda: y.copy_(x)) for _ in range(10))
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best_mm = min(_time(lambda: a @ b) for _ in range(10))
    return {
        "copy_GB_s": 2 * x.numel() * 4 / best_copy / 1e9,  # read + write
        "matmul_GFLOP_s": 2 * 1024**3 / best_mm / 1e9,
    }


def _time(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
