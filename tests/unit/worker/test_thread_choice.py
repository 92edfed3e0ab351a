"""--threads: an explicit count wins; 0 (the default) is one thread per core this process may
use, a cgroup CPU quota included (torch's own default ignores it), and the ranks of a
tensor-parallel worker share those cores instead of each taking all of them."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from services.worker import thread_choice
from services.worker.config import WorkerConfig
from services.worker.serving import tp_launch
from services.worker.serving.tp_rank import RankSpec
from services.worker.thread_choice import (
    cgroup_cpu_quota,
    rank_threads,
    usable_cpus,
    worker_threads,
)


def test_auto_is_one_thread_per_usable_core() -> None:
    assert worker_threads(0, cpus=2) == 2
    assert worker_threads(0, cpus=1) == 1
    assert worker_threads(0) == usable_cpus()


def test_a_cgroup_quota_caps_the_cores(tmp_path: Path) -> None:
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 CPUs: 2 threads
    assert cgroup_cpu_quota(cpu_max) == 2
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(cpu_max) == min(affinity, 2)
    cpu_max.write_text("max 100000\n")
    assert cgroup_cpu_quota(cpu_max) is None and usable_cpus(cpu_max) == affinity
    assert cgroup_cpu_quota(tmp_path / "missing") is None


def test_an_explicit_count_wins() -> None:
    assert worker_threads(1, cpus=2) == 1
    assert worker_threads(8, cpus=2) == 8
    with pytest.raises(ValueError, match="--threads must be >= 0"):
        worker_threads(-1)


def test_the_flag_defaults_to_auto_and_refuses_negative_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LAYERSERVE_WORKER_THREADS", raising=False)
    assert WorkerConfig.from_args([]).threads == 0
    monkeypatch.setenv("LAYERSERVE_WORKER_THREADS", "2")
    assert WorkerConfig.from_args([]).threads == 2
    with pytest.raises(ValueError, match="--threads must be >= 0"):
        WorkerConfig.from_args(["--threads", "-1"])


def test_tensor_parallel_ranks_share_the_usable_cores() -> None:
    assert rank_threads(0, 2, cpus=8) == 4
    assert rank_threads(0, 3, cpus=8) == 2
    assert rank_threads(0, 4, cpus=2) == 1  # never none
    assert rank_threads(0, 1, cpus=8) == 8
    assert rank_threads(3, 4, cpus=8) == 3  # an explicit count is each rank's
    with pytest.raises(ValueError, match="tensor-parallel size"):
        rank_threads(0, 0)


def test_every_rank_is_started_with_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    """What start_tensor_parallel hands rank 0 (built here) and the spawned ranks."""
    started: list[RankSpec] = []

    class Process:
        def __init__(self, target, args, name, daemon) -> None:
            started.append(args[0])
            self.pid = 0

        def start(self) -> None:
            pass

    class Watch:
        def __init__(self, processes) -> None:
            pass

        def start(self) -> None:
            pass

        def disarm(self) -> None:
            pass

    monkeypatch.setattr(thread_choice, "usable_cpus", lambda: 8)
    monkeypatch.setattr(RankSpec, "check", lambda self: None)
    monkeypatch.setattr(
        tp_launch.mp, "get_context", lambda method: SimpleNamespace(Process=Process)
    )
    monkeypatch.setattr(tp_launch, "RankWatch", Watch)
    monkeypatch.setattr(tp_launch, "build_rank_runner", lambda spec, rank, on_close: spec)
    spec = RankSpec(4, None, "m", "cpu", "float32", 16, 64, None, None, "torch", threads=0)
    rank0 = tp_launch.start_tensor_parallel(spec)
    assert [s.threads for s in [rank0, *started]] == [2, 2, 2, 2]
