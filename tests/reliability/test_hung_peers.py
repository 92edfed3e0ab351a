"""Hung peers rather than dead ones (SIGSTOP: the process keeps its sockets open and answers
nothing), under load:

- one of two worker replicas: once keepalive pings go unanswered (shortened here to 1 s +
  2 s) the scheduler drops it and its streams move to the other replica, where they complete
  (tests/reliability/test_worker_freeze.py checks their text); new requests go to the
  survivor, and after SIGCONT the worker rejoins;
- Redis: every request is still served (rate limits fail open after their 0.5 s socket
  timeout), none lost.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

import httpx

from services.stack import Stack
from tests.e2e.conftest import free_ports
from tests.redis_server import RedisServer
from tests.reliability.conftest import API_KEY, AUTH, MODEL, all_worker_stats, eventually
from tests.reliability.in_flight import grpc_stream, http_stream
from tests.reliability.load import COMPLETED, ERRORED, LOST, LoadResult
from tests.reliability.record import write_record
from tests.reliability.test_redis_faults import LIMIT_ARGS, RequestLoop

LONG = 3000
KEEPALIVE = {"LAYERSERVE_GRPC_KEEPALIVE_S": "1", "LAYERSERVE_GRPC_KEEPALIVE_TIMEOUT_S": "2"}
DROPPED_WITHIN_S = 10.0  # keepalive 1 s + 2 s, with room for a loaded 2-core machine
HUNG_FOR_S = 3.0


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[float]:
    """SIGSTOPs `pid`, yields when, and SIGCONTs it whatever happens."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield time.monotonic()
    finally:
        os.kill(pid, signal.SIGCONT)


def complete(stack: Stack) -> tuple[int, float]:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    started = time.monotonic()
    url = f"{stack.http_url}/v1/completions"
    status = httpx.post(url, json=body, headers=AUTH, timeout=60).status_code
    return status, time.monotonic() - started


def test_a_hung_worker_is_dropped_its_streams_move_and_the_other_replica_serves(
    own_stack: Callable[..., Stack],
):
    stack = own_stack(
        worker_ports=tuple(free_ports(2)),
        scheduler_args=["--routing", "round-robin"],
        env={"LAYERSERVE_API_KEYS": API_KEY, **KEEPALIVE},
    )
    hung = f"127.0.0.1:{stack.config.worker_ports[0]}"
    flights = [http_stream(stack, LONG) for _ in range(6)] + [grpc_stream(stack, LONG)]
    for flight in flights:
        assert flight.started.wait(60)
    with stopped(stack.procs["worker0"].pid) as stopped_at:
        dropped_s = eventually(
            lambda: hung not in all_worker_stats(stack), "the hung worker dropped", 30
        )
        during = [complete(stack) for _ in range(6)]
        outcomes = [f.wait() for f in flights]
        hung_for = time.monotonic() - stopped_at
    rejoin_s = eventually(lambda: hung in all_worker_stats(stack), "rejoined after SIGCONT", 60)
    after = [complete(stack)[0] for _ in range(4)]
    write_record(
        "hung_worker",
        "a worker hung (SIGSTOP) mid-stream",
        {
            "load": f"{len(flights)} streams of {LONG} tokens (6 HTTP SSE, 1 gRPC) on two "
            "null-worker replicas, round-robin; keepalive 1 s, timeout 2 s",
            "faults": [f"SIGSTOP to worker0 for {hung_for:.1f}s, then SIGCONT"],
            "outcomes": LoadResult(outcomes).counts(),
            "errors": LoadResult(outcomes).errors(),
            "notes": [
                f"the hung replica was dropped {dropped_s:.1f}s after the SIGSTOP and its "
                "streams moved to the other replica: "
                f"{LoadResult(outcomes).count(COMPLETED)} of {len(flights)} completed",
                f"{sum(s == 200 for s, _ in during)} of {len(during)} new requests while it "
                f"hung answered 200 (slowest {max(t for _, t in during):.2f}s)",
                f"after SIGCONT it rejoined in {rejoin_s:.1f}s; {after.count(200)} of "
                f"{len(after)} requests after answered 200",
            ],
        },
    )
    assert [o.kind for o in outcomes] == [COMPLETED] * len(flights), outcomes
    assert dropped_s < DROPPED_WITHIN_S
    assert [s for s, _ in during] == [200] * len(during)
    assert after == [200] * len(after)


def test_a_hung_redis_slows_requests_but_loses_none(
    own_stack: Callable[..., Stack], redis_server: RedisServer
):
    stack = own_stack(
        worker_ports=tuple(free_ports(2)),
        env={"LAYERSERVE_API_KEYS": API_KEY, "LAYERSERVE_REDIS_URL": redis_server.url},
        gateway_args=LIMIT_ARGS,
    )
    stream = http_stream(stack, LONG)
    assert stream.started.wait(60)
    with RequestLoop(stack, 4) as loop:
        time.sleep(1.0)
        with stopped(redis_server._proc.pid) as stopped_at:  # type: ignore[union-attr]
            timed = [complete(stack) for _ in range(3)]
            time.sleep(max(0.0, HUNG_FOR_S - (time.monotonic() - stopped_at)))
            resumed_at = time.monotonic()
        time.sleep(2.0)
    streamed = stream.wait()
    during = [s for t, s in loop.statuses if stopped_at <= t < resumed_at]
    failed = [s for _, s in loop.statuses if s != 200]
    write_record(
        "hung_redis",
        "Redis hung (SIGSTOP)",
        {
            "load": "4 clients sending short chat requests back to back and one "
            f"{LONG}-token stream; rate limits and the prefix index in Redis",
            "faults": [f"SIGSTOP to redis-server for {HUNG_FOR_S:g}s, then SIGCONT"],
            "outcomes": {
                COMPLETED: len(loop.statuses) - len(failed) + (streamed.kind == COMPLETED),
                ERRORED: len([s for s in failed if s]) + (streamed.kind == ERRORED),
                LOST: failed.count(0) + (streamed.kind == LOST),
            },
            "notes": [
                f"{len(during)} requests answered while Redis hung, all 200; single requests "
                f"took up to {max(t for _, t in timed):.2f}s (the rate limiter's 0.5 s socket "
                "timeout, then fail-open)",
            ],
        },
    )
    assert failed == [], failed
    assert [s for s, _ in timed] == [200] * 3
    assert len(during) >= 4
    assert streamed.kind == COMPLETED, streamed
