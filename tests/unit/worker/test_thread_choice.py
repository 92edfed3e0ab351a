"""--threads: an explicit count wins; 0 (the default) is one thread per core this process may
use, a cgroup CPU quota included (torch's own default ignores it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.worker.config import WorkerConfig
from services.worker.thread_choice import cgroup_cpu_quota, usable_cpus, worker_threads


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
