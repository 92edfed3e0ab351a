"""Which scheduler replica a request goes to: the one owning the worker that caches its
prefix, whichever that is, until that worker is a prompt's worth busier; idle replicas share
new prefixes. And what --scheduler accepts."""

from __future__ import annotations

import pytest

from services.tokenizer.scheduler_addresses import parse_schedulers, resolve_schedulers
from services.tokenizer.scheduler_choice import (
    SchedulerCandidate,
    WorkerCandidate,
    pick_scheduler,
)

PROMPT = 1024  # tokens; blocks of 16


def worker(running: int = 0, cached_blocks: int = 0) -> WorkerCandidate:
    return WorkerCandidate(running, free_blocks=1000, block_size=16, cached_blocks=cached_blocks)


def scheduler(*workers: WorkerCandidate, sent: int = 0, recent: int = 0) -> SchedulerCandidate:
    return SchedulerCandidate(workers, sent, recent_blocks=recent, recent_block_size=16)


def test_the_replica_whose_worker_caches_the_prefix_wins_whichever_it_is() -> None:
    for holder in range(3):
        candidates = [scheduler(worker(), worker()) for _ in range(3)]
        cached = scheduler(worker(), worker(cached_blocks=60))
        candidates[holder] = cached
        assert pick_scheduler(candidates, PROMPT, turn=holder + 1) == holder


def test_a_prefix_sent_moments_ago_counts_before_the_index_reports_it() -> None:
    candidates = [scheduler(worker()), scheduler(worker(), recent=60), scheduler(worker())]
    assert pick_scheduler(candidates, PROMPT, turn=0) == 1


def test_load_outweighs_the_prefix_once_it_costs_more_than_the_prompt() -> None:
    busy = scheduler(worker(running=10, cached_blocks=60))
    idle = scheduler(worker())
    assert pick_scheduler([busy, idle], PROMPT, turn=0) == 0  # 160 tokens of load < 960
    busier = scheduler(worker(running=70, cached_blocks=60))
    assert pick_scheduler([busier, idle], PROMPT, turn=0) == 1
    # Requests sent since the last report count too.
    assert pick_scheduler([scheduler(worker(), sent=70 * 1), idle], 16, turn=0) == 1


def test_equals_take_turns() -> None:
    candidates = [scheduler(worker()) for _ in range(3)]
    picks = {pick_scheduler(candidates, PROMPT, turn=t) for t in range(3)}
    assert picks == {0, 1, 2}


def test_scheduler_lists_and_dns_names() -> None:
    assert parse_schedulers("a:1, b:2") == ("a:1", "b:2")
    assert parse_schedulers("dns:///scheduler-headless:50060") == (
        "dns:///scheduler-headless:50060",
    )
    for bad in ("a:1,", "a", "a:x", "dns:///s:1,a:2"):
        with pytest.raises(ValueError):
            parse_schedulers(bad)


async def test_a_dns_name_resolves_to_every_replica() -> None:
    found = await resolve_schedulers(("dns:///localhost:7",))
    assert "127.0.0.1:7" in found or "[::1]:7" in found, found
    assert await resolve_schedulers(("a:1", "b:2")) == ["a:1", "b:2"]
    assert await resolve_schedulers(("dns:///no-such-host.invalid:7",)) == []
