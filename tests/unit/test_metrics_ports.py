"""Where each service serves its metrics: its own --metrics-port or LAYERSERVE_METRICS_PORT (a
container's), and under `make run` a port per process from --metrics-port-base, so that
services on one host never ask for the same port."""

from __future__ import annotations

import pytest

from services.launcher import parse_args
from services.scheduler.config import SchedulerConfig
from services.stack import StackConfig
from services.tokenizer.config import TokenizerConfig
from services.worker.config import WorkerConfig

CONFIGS = (TokenizerConfig, SchedulerConfig, WorkerConfig)


@pytest.mark.parametrize("config", CONFIGS)
def test_a_service_serves_no_metrics_unless_given_a_port(config, monkeypatch) -> None:
    monkeypatch.delenv("LAYERSERVE_METRICS_PORT", raising=False)
    assert config.from_args([]).metrics_port == 0
    monkeypatch.setenv("LAYERSERVE_METRICS_PORT", "9100")
    assert config.from_args([]).metrics_port == 9100
    assert config.from_args(["--metrics-port", "9200"]).metrics_port == 9200  # flag wins
    with pytest.raises(ValueError, match="--metrics-port"):
        config.from_args(["--metrics-port", "70000"])


def test_make_run_gives_each_process_its_own_metrics_port() -> None:
    config = parse_args(["--workers", "2", "--metrics-port-base", "9300"])
    args = {
        name: config.metrics_args(name) for name in ("tokenizer", "scheduler", "worker0", "worker1")
    }
    assert args == {
        "tokenizer": ["--metrics-port", "9300"],
        "scheduler": ["--metrics-port", "9301"],
        "worker0": ["--metrics-port", "9302"],
        "worker1": ["--metrics-port", "9303"],
    }


def test_without_a_base_every_process_is_told_to_serve_none() -> None:
    # Explicitly: a LAYERSERVE_METRICS_PORT the children inherit would make them collide.
    config = parse_args([])
    assert config.metrics_args("scheduler") == ["--metrics-port", "0"]


def test_a_metrics_port_for_no_such_process_is_refused() -> None:
    config = StackConfig(worker_ports=(1,), metrics_ports={"worker1": 9000})
    with pytest.raises(ValueError, match="worker1"):
        config.metrics_args("worker0")
