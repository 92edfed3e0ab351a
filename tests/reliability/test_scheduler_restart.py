"""The scheduler killed and started again: requests in flight end with UNAVAILABLE, the gateway
answers 503 while the scheduler is away, and serves again once it is back, with neither the
gateway nor the tokenizer restarted."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from services.stack import Stack
from tests.reliability.conftest import AUTH, MODEL, eventually
from tests.reliability.in_flight import grpc_stream, http_stream
from tests.reliability.load import COMPLETED, ERRORED, LOST
from tests.reliability.record import write_record

LONG = 3000
ENDS_WITHIN_S = 5.0
RECOVERS_WITHIN_S = 60.0
DOWN_FOR_S = 3.0  # how long the scheduler stays away


def complete(stack: Stack) -> httpx.Response:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    return httpx.post(f"{stack.http_url}/v1/completions", json=body, headers=AUTH, timeout=30)


def test_gateway_answers_503_while_the_scheduler_is_away_and_recovers(
    own_stack: Callable[..., Stack],
):
    stack = own_stack()
    front = {name: stack.procs[name].pid for name in ("gateway", "tokenizer")}
    flights = [http_stream(stack, LONG), grpc_stream(stack, LONG)]
    for flight in flights:
        assert flight.started.wait(60)
    killed_at = time.monotonic()
    stack.kill("scheduler")
    outcomes = [f.wait() for f in flights]
    ended_after = max(f.ended_at - killed_at for f in flights)
    assert [(o.kind, o.error) for o in outcomes] == [(ERRORED, "unavailable")] * 2, outcomes
    assert ended_after < ENDS_WITHIN_S

    statuses = []
    while time.monotonic() - killed_at < DOWN_FOR_S:
        response = complete(stack)
        statuses.append(response.status_code)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "unavailable"
        assert response.headers["Retry-After"]
    ready = httpx.get(f"{stack.http_url}/ready", timeout=10)
    assert ready.status_code == 503

    stack.restart("scheduler")
    restarted_at = time.monotonic()
    recover_s = eventually(
        lambda: complete(stack).status_code == 200, "a request served again", RECOVERS_WITHIN_S
    )
    eventually(lambda: httpx.get(f"{stack.http_url}/ready", timeout=10).status_code == 200, "ready")
    after = [complete(stack).status_code for _ in range(5)]
    assert after == [200] * 5
    assert {name: stack.procs[name].pid for name in front} == front  # never restarted
    stack.check_alive()
    write_record(
        "scheduler_restart",
        "scheduler killed and restarted",
        {
            "load": "2 long streams in flight (HTTP SSE, gRPC); then requests in a loop while "
            f"the scheduler was away ({DOWN_FOR_S:g}s) and after",
            "faults": ["SIGKILL to the scheduler mid-stream, restarted on the same port"],
            "outcomes": {
                COMPLETED: len(after),
                ERRORED: len(outcomes) + len(statuses),
                LOST: 0,
            },
            "errors": {"in flight: unavailable": 2, "while away: 503 unavailable": len(statuses)},
            "notes": [
                f"both streams ended with UNAVAILABLE {ended_after:.2f}s after the kill",
                f"{len(statuses)} requests while the scheduler was away: all 503 with "
                "Retry-After; /ready 503",
                f"served again {time.monotonic() - restarted_at:.1f}s after the restart "
                f"(first success after {recover_s:.1f}s of retries); gateway and tokenizer "
                "kept their pids",
            ],
        },
    )
