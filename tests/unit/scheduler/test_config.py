"""The scheduler's flags and LAYERSERVE_* variables."""

from __future__ import annotations

import pytest

from services.scheduler.config import DEFAULT_WORKER, SchedulerConfig

VARIABLES = (
    "SCHEDULER_WORKERS",
    "WORKER_REGISTRATION",
    "ADMIN_KEY",
    "ROUTING",
    "PREFIX_CACHING",
    "ASYNC_SCHEDULING",
)


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*VARIABLES, "REDIS_URL"):
        monkeypatch.delenv(f"LAYERSERVE_{name}", raising=False)


def test_workers_default_to_make_runs_one_unless_they_register(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert SchedulerConfig.from_args([]).workers == (DEFAULT_WORKER,)
    monkeypatch.setenv("LAYERSERVE_SCHEDULER_WORKERS", "w1:1,w2:2")
    assert SchedulerConfig.from_args([]).workers == ("w1:1", "w2:2")
    assert SchedulerConfig.from_args(["--worker", "w3:3"]).workers == ("w3:3",)
    monkeypatch.delenv("LAYERSERVE_SCHEDULER_WORKERS")
    with pytest.raises(ValueError, match="--worker-registration needs LAYERSERVE_ADMIN_KEY"):
        SchedulerConfig.from_args(["--worker-registration"])
    monkeypatch.setenv("LAYERSERVE_ADMIN_KEY", "k")
    assert SchedulerConfig.from_args(["--worker-registration"]).workers == ()
    monkeypatch.setenv("LAYERSERVE_WORKER_REGISTRATION", "1")
    assert SchedulerConfig.from_args([]).worker_registration is True
    assert SchedulerConfig.from_args(["--no-worker-registration"]).workers == (DEFAULT_WORKER,)


def test_secrets_stay_out_of_the_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAYERSERVE_ADMIN_KEY", "admin-secret")
    monkeypatch.setenv("LAYERSERVE_REDIS_URL", "redis://:pw-secret@r:6379/0")
    config = SchedulerConfig.from_args([])
    assert config.admin_key == "admin-secret"
    assert "secret" not in repr(config)


def test_routing_and_prefix_caching(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SchedulerConfig.from_args([]).routing == "prefix"
    monkeypatch.setenv("LAYERSERVE_ROUTING", "load")
    assert SchedulerConfig.from_args([]).routing == "load"
    assert SchedulerConfig.from_args(["--routing", "round-robin"]).routing == "round-robin"
    monkeypatch.setenv("LAYERSERVE_ROUTING", "random")
    with pytest.raises(
        ValueError,
        match="^LAYERSERVE_ROUTING=random: must be one of prefix, load, round-robin "
        r"\(the variable of --routing\)$",
    ):
        SchedulerConfig.from_args([])
    monkeypatch.delenv("LAYERSERVE_ROUTING")
    monkeypatch.setenv("LAYERSERVE_PREFIX_CACHING", "0")
    assert SchedulerConfig.from_args([]).enable_prefix_caching is False
    assert SchedulerConfig.from_args(["--prefix-caching"]).enable_prefix_caching is True
    with pytest.raises(ValueError, match="--max-num-batched-tokens and --max-num-seqs"):
        SchedulerConfig.from_args(["--max-num-seqs", "0"])


def test_speculation_is_auto_by_default_a_number_or_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAYERSERVE_NUM_SPECULATIVE_TOKENS", raising=False)
    config = SchedulerConfig.from_args([])
    assert config.speculation_auto and config.proposer().k == 8  # where steps are synchronous
    fixed = SchedulerConfig.from_args(["--num-speculative-tokens", "4"])
    assert not fixed.speculation_auto and fixed.proposer().k == 4  # everywhere
    assert SchedulerConfig.from_args(["--num-speculative-tokens", "0"]).proposer() is None
    monkeypatch.setenv("LAYERSERVE_NUM_SPECULATIVE_TOKENS", "0")
    assert SchedulerConfig.from_args([]).proposer() is None
    with pytest.raises(ValueError, match="--num-speculative-tokens.*auto or an integer"):
        SchedulerConfig.from_args(["--num-speculative-tokens", "some"])


def test_async_scheduling_is_by_device_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert SchedulerConfig.from_args([]).steps_ahead() is None  # on for a GPU worker
    assert SchedulerConfig.from_args(["--async-scheduling", "off"]).steps_ahead() is False
    monkeypatch.setenv("LAYERSERVE_ASYNC_SCHEDULING", "on")
    assert SchedulerConfig.from_args([]).steps_ahead() is True
    assert SchedulerConfig.from_args(["--async-scheduling", "auto"]).steps_ahead() is None
    monkeypatch.setenv("LAYERSERVE_ASYNC_SCHEDULING", "1")
    with pytest.raises(ValueError, match="^LAYERSERVE_ASYNC_SCHEDULING=1: must be one of"):
        SchedulerConfig.from_args([])
