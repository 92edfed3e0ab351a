"""A worker frozen with SIGSTOP (no close, no reset: as a host cut off the network) while it
runs streams: the scheduler's keepalive pings (shortened here to 1 s) find it silent, drop it,
and move its requests to the other replica, where they end with exactly the text of an
uninterrupted run (the null worker's tokens follow from the sequence, as a greedy model's
would). After SIGCONT it comes back by itself."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Callable
from functools import partial

import httpx

from services.stack import Stack
from tests.e2e.conftest import free_ports
from tests.reliability.conftest import API_KEY, all_worker_stats, eventually
from tests.reliability.test_scheduler_failover import (
    assert_as_uninterrupted,
    streams_through,
    uninterrupted,
)

STREAMS = 40
STEP_S = 0.1  # each null step sleeps this long: the streams outlast the freeze's detection
KEEPALIVE_S = 1.0
DROPPED_WITHIN_S = 6.0  # a ping every second, answered within one, plus a busy machine


def worker_migrations(stack: Stack) -> float:
    url = f"http://127.0.0.1:{stack.config.metrics_ports['scheduler']}/metrics"
    page = httpx.get(url).text
    pattern = r'^layerserve:request_migrations_total\{[^}]*reason="worker_lost"[^}]*\} (\S+)$'
    return sum(float(c) for c in re.findall(pattern, page, re.M))


def test_a_frozen_worker_is_dropped_its_streams_move_and_it_comes_back(
    own_stack: Callable[..., Stack],
):
    ports = free_ports(3)
    stack = own_stack(
        worker_ports=tuple(ports[:2]),
        metrics_ports={"scheduler": ports[2]},
        worker_args=["--num-blocks", "2048", "--null-step-seconds", str(STEP_S)],
        scheduler_args=["--routing", "round-robin"],
        env={
            "LAYERSERVE_API_KEYS": API_KEY,
            "LAYERSERVE_GRPC_KEEPALIVE_S": str(KEEPALIVE_S),
            "LAYERSERVE_GRPC_KEEPALIVE_TIMEOUT_S": str(KEEPALIVE_S),
        },
    )
    frozen_address = f"127.0.0.1:{ports[0]}"
    eventually(lambda: len(all_worker_stats(stack)) == 2, "both workers connected", 60)
    frozen = stack.procs["worker0"]
    froze_at: list[float] = []

    def freeze() -> None:
        froze_at.append(time.monotonic())
        frozen.send_signal(signal.SIGSTOP)

    try:
        reference = asyncio.run(uninterrupted(stack))
        results, _ = asyncio.run(streams_through(stack, STREAMS, freeze))
        dropped = frozen_address not in all_worker_stats(stack)
    finally:
        frozen.send_signal(signal.SIGCONT)
    assert_as_uninterrupted(reference, results)
    assert dropped, "the frozen worker was still listed"
    assert worker_migrations(stack) >= 1
    back_s = eventually(
        lambda: frozen_address in all_worker_stats(stack), "the thawed worker back", 60
    )
    print(f"frozen worker back {back_s:.1f}s after SIGCONT")


def test_migration_is_bounded_by_the_wait_for_a_replica(own_stack: Callable[..., Stack]):
    """No replica left: the requests wait --migration-wait-s for one, then end UNAVAILABLE."""
    ports = free_ports(1)
    stack = own_stack(
        worker_ports=tuple(ports),
        worker_args=["--null-step-seconds", str(STEP_S)],
        scheduler_args=["--migration-wait-s", "1"],
    )
    kill = partial(stack.kill, "worker0")
    started = time.monotonic()
    results, took_s = asyncio.run(streams_through(stack, 4, kill))
    assert all(text.startswith("error UNAVAILABLE") for _, text, _ in results), results
    assert all("no other worker" in text for _, text, _ in results), results
    assert took_s < 10, took_s
    assert time.monotonic() - started < 60
