"""How many intra-op threads the worker's torch uses: --threads, or by default one per core
this process may really use: its affinity mask, capped by a cgroup CPU quota (a Kubernetes CPU
limit), which torch's own default ignores, so that a pod limited to 2 CPUs on a 64-core node
does not run 64 OpenMP threads that the quota throttles in turn.

Measured through the gateway on 2 shared cores (docs/benchmarks.md, "Issue 18"): 2 threads
beat 1 even with the other services and a load average of 7-12 on the machine, so the default
does not leave a core idle for the other services. No pinning: on a shared machine a thread
pinned to a busy core has nowhere else to go.

The ranks of a tensor-parallel worker share those cores (rank_threads): N ranks of one thread
per core each would run N times as many threads as there are cores, and every collective
waits for the rank that the oversubscription slowed most."""

from __future__ import annotations

import math
import os
from pathlib import Path

CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


def usable_cpus(cpu_max: Path = CPU_MAX) -> int:
    """The cores this process may run on (affinity), capped by its cgroup's CPU quota."""
    if hasattr(os, "sched_getaffinity"):
        cpus = len(os.sched_getaffinity(0))
    else:
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_quota(cpu_max)
    return max(1, min(cpus, quota)) if quota is not None else cpus


def cgroup_cpu_quota(cpu_max: Path = CPU_MAX) -> int | None:
    """CPUs' worth of time the cgroup allows (rounded up); None: no quota or no cgroup v2."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return math.ceil(int(quota) / int(period))


def worker_threads(requested: int, cpus: int | None = None) -> int:
    """--threads `requested` (0: auto, one per usable core) -> the intra-op thread count."""
    if requested < 0:
        raise ValueError(f"--threads must be >= 0 (0: auto), got {requested}")
    return requested or (usable_cpus() if cpus is None else cpus)


def rank_threads(requested: int, world_size: int, cpus: int | None = None) -> int:
    """--threads `requested` for each of `world_size` tensor-parallel ranks on one machine
    (0: auto, the usable cores shared evenly, at least one each) -> each rank's thread count."""
    if world_size < 1:
        raise ValueError(f"the tensor-parallel size must be >= 1, got {world_size}")
    if requested:
        return worker_threads(requested)
    return max(1, worker_threads(0, cpus) // world_size)
