"""A worker killed with SIGKILL mid-stream: its requests move to the other replica and
complete there (the scheduler recomputes them with their output kept); the last worker's
requests wait --migration-wait-s for a replica, then end with UNAVAILABLE (HTTP 503, an SSE
error event, a gRPC status). New requests go to the survivor, and the worker, started again,
rejoins and gets requests.

tests/e2e/test_replicas.py covers the plain failover (a replica killed while idle); these
tests kill one while it streams."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from services.stack import Stack
from tests.e2e.conftest import free_ports, loopback_config, start_stack
from tests.reliability.conftest import API_KEY, AUTH, MODEL, all_worker_stats, eventually
from tests.reliability.in_flight import InFlight, grpc_stream, http_full, http_stream
from tests.reliability.load import COMPLETED, ERRORED, LoadResult
from tests.reliability.record import write_record

LONG = 3000  # tokens: seconds of null-worker output, so the kill lands mid-stream
# The moved streams run to their end on the survivor: shorter, still seconds of output.
MOVED = 2000
ENDS_WITHIN_S = 5.0  # a dead worker's requests end this soon after the wait for a replica
MIGRATION_WAIT_S = 2.0  # how long they wait for one (--migration-wait-s)
REJOIN_WITHIN_S = 60.0


def complete(stack: Stack, max_tokens: int = 4) -> httpx.Response:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": max_tokens}
    return httpx.post(f"{stack.http_url}/v1/completions", json=body, headers=AUTH, timeout=60)


def address_of(stack: Stack, worker: str) -> str:
    return f"127.0.0.1:{stack.config.worker_ports[int(worker.removeprefix('worker'))]}"


def kill_mid_stream(stack: Stack, flights: list[InFlight], worker: str) -> float:
    """Waits until every request has produced output, then SIGKILLs `worker`; returns when."""
    for flight in flights:
        assert flight.started.wait(60), "a request never started"
    assert all(f.outcome is None for f in flights), "a request ended before the kill"
    killed_at = time.monotonic()
    stack.kill(worker)
    return killed_at


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Two null-worker replicas, requests dealt to them in turn."""
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        worker_ports=tuple(free_ports(2)),
        scheduler_args=["--routing", "round-robin", "--migration-wait-s", str(MIGRATION_WAIT_S)],
        log_dir=Path(tmp_path_factory.mktemp("worker-fault-logs")),
        env={"LAYERSERVE_API_KEYS": API_KEY},
        redis="off",
        ready_timeout=120,
        stop_timeout=10,
    )
    stack = start_stack(config)
    yield stack
    stack.stop()


def test_killed_replica_moves_its_streams_and_rejoins(replicas: Stack):
    stack = replicas
    flights = [http_stream(stack, MOVED) for _ in range(8)]
    flights += [grpc_stream(stack, MOVED) for _ in range(2)]
    killed_at = kill_mid_stream(stack, flights, "worker0")
    outcomes = [f.wait() for f in flights]
    ended_after = [round(f.ended_at - killed_at, 2) for f in flights]

    # Round-robin put half of them on the killed replica: they moved to the survivor.
    assert [o.kind for o in outcomes] == [COMPLETED] * len(flights), outcomes

    after_kill = [complete(stack).status_code for _ in range(6)]
    assert after_kill == [200] * 6
    assert address_of(stack, "worker0") not in all_worker_stats(stack)

    stack.restart("worker0")
    rejoin_s = eventually(
        lambda: address_of(stack, "worker0") in all_worker_stats(stack),
        "the restarted worker back in the scheduler's rotation",
        timeout=REJOIN_WITHIN_S,
    )
    # Connected (listed) comes before ready: its health turns SERVING a moment later, and
    # only then does round-robin deal it requests. Every request answers meanwhile.
    after_rejoin: list[int] = []

    def serves_again() -> bool:
        after_rejoin.append(complete(stack).status_code)
        return all_worker_stats(stack)[address_of(stack, "worker0")].steps > 0

    serving_s = rejoin_s + eventually(
        serves_again, "the restarted worker serving requests", timeout=REJOIN_WITHIN_S
    )
    assert after_rejoin == [200] * len(after_rejoin)
    write_record(
        "worker_kill_replica",
        "SIGKILL of one of two replicas mid-stream",
        {
            "load": f"{len(flights)} streams of {MOVED} tokens (8 HTTP SSE, 2 gRPC) on two "
            "null-worker replicas, round-robin routing",
            "faults": ["SIGKILL to worker0 while every stream was producing tokens"],
            "outcomes": LoadResult(outcomes).counts(),
            "errors": {},
            "notes": [
                "the killed replica's requests moved to the survivor (recomputed with their "
                f"output kept): all {len(flights)} completed, the last {max(ended_after):.2f}s "
                "after the kill",
                "6 of 6 new requests after the kill answered 200 (the survivor)",
                f"the restarted worker rejoined in {rejoin_s:.1f}s and ran requests "
                f"{serving_s:.1f}s after its restart; {len(after_rejoin)} of "
                f"{len(after_rejoin)} requests meanwhile answered 200",
            ],
        },
    )


def test_the_last_worker_killed_mid_request_gives_503_and_unavailable(replicas: Stack):
    stack = replicas
    if stack.procs["worker1"].poll() is None:
        stack.kill("worker1")  # worker0 is left to serve alone
    eventually(lambda: list(all_worker_stats(stack)) == [address_of(stack, "worker0")], "1 left")
    flights = [http_full(stack, LONG), http_stream(stack, LONG), grpc_stream(stack, LONG)]
    eventually(
        lambda: all_worker_stats(stack)[address_of(stack, "worker0")].running == 3,
        "all three requests running",
    )
    killed_at = kill_mid_stream(stack, flights[1:], "worker0")
    outcomes = [f.wait() for f in flights]
    ended_after = [round(f.ended_at - killed_at, 2) for f in flights]

    assert [(o.kind, o.error) for o in outcomes] == [(ERRORED, "unavailable")] * 3
    assert outcomes[0].http_status == 503
    assert max(ended_after) < MIGRATION_WAIT_S + ENDS_WITHIN_S, ended_after
    started = time.monotonic()
    refused = complete(stack)
    refused_s = time.monotonic() - started
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"]
    assert refused_s < ENDS_WITHIN_S

    stack.restart("worker0")
    back_s = eventually(
        lambda: complete(stack).status_code == 200, "a request served", REJOIN_WITHIN_S
    )
    stack.restart("worker1")
    eventually(lambda: len(all_worker_stats(stack)) == 2, "both replicas back", REJOIN_WITHIN_S)
    write_record(
        "worker_kill_last",
        "SIGKILL of the last live worker mid-request",
        {
            "load": f"3 requests of {LONG} tokens on the one live null worker (its replica "
            "killed before): HTTP non-streaming, HTTP SSE, gRPC stream",
            "faults": ["SIGKILL to the last live worker while all three ran"],
            "outcomes": LoadResult(outcomes).counts(),
            "errors": {"unavailable": 3},
            "notes": [
                f"all three waited {MIGRATION_WAIT_S:g}s (--migration-wait-s) for another "
                f"replica and ended {max(ended_after):.2f}s after the kill at the latest: HTTP "
                "503, an SSE error event (unavailable), gRPC UNAVAILABLE",
                f"a new request while no worker was up: 503 with Retry-After in {refused_s:.2f}s",
                f"after the restart, requests were served again within {back_s:.1f}s",
            ],
        },
    )
