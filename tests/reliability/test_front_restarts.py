"""The front of the stack under faults:

- the tokenizer SIGKILLed mid-stream and started again: the streams it carried end with
  UNAVAILABLE within seconds, requests while it is away get a fast 503, the scheduler frees
  their KV blocks, and once it is back the stack serves with no other process restarted;
- the gateway sent SIGTERM with streams in flight: it stops taking new requests, every stream
  in flight finishes, and it exits 0.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import httpx

from services.stack import Stack
from tests.reliability.conftest import AUTH, MODEL, all_blocks_free, eventually
from tests.reliability.in_flight import grpc_stream, http_stream
from tests.reliability.load import COMPLETED, ERRORED, LOST, LoadResult
from tests.reliability.record import write_record

LONG = 3000
DRAINED = 1000  # tokens: a couple of seconds of null-worker output, finished during the drain
ENDS_WITHIN_S = 5.0
DOWN_FOR_S = 2.0


def complete(stack: Stack) -> tuple[int, float]:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
    started = time.monotonic()
    try:
        url = f"{stack.http_url}/v1/completions"
        status = httpx.post(url, json=body, headers=AUTH, timeout=30).status_code
    except httpx.ConnectError:
        status = 0  # refused: nobody listens
    return status, time.monotonic() - started


def test_tokenizer_killed_and_restarted(own_stack: Callable[..., Stack]):
    stack = own_stack()
    others = {name: stack.procs[name].pid for name in ("gateway", "scheduler", "worker0")}
    flights = [http_stream(stack, LONG) for _ in range(3)] + [grpc_stream(stack, LONG)]
    for flight in flights:
        assert flight.started.wait(60)
    killed_at = time.monotonic()
    stack.kill("tokenizer")
    outcomes = [f.wait() for f in flights]
    ended_after = max(f.ended_at - killed_at for f in flights)
    away = []
    while time.monotonic() - killed_at < DOWN_FOR_S:
        away.append(complete(stack))
    stack.restart("tokenizer")
    restarted_at = time.monotonic()
    eventually(lambda: complete(stack)[0] == 200, "served again", 60)
    back_s = time.monotonic() - restarted_at
    freed_s = eventually(lambda: all_blocks_free(stack), "the lost streams' KV blocks freed")
    after = [complete(stack)[0] for _ in range(5)]
    write_record(
        "tokenizer_restart",
        "tokenizer killed and restarted",
        {
            "load": f"{len(flights)} streams of {LONG} tokens (3 HTTP SSE, 1 gRPC); then "
            f"requests in a loop while the tokenizer was away ({DOWN_FOR_S:g}s) and after",
            "faults": ["SIGKILL to the tokenizer mid-stream, restarted on the same port"],
            "outcomes": {
                COMPLETED: len(after),
                ERRORED: len(outcomes) + len(away),
                LOST: LoadResult(outcomes).count(LOST),
            },
            "errors": {"in flight: unavailable": len(outcomes), "while away: 503": len(away)},
            "notes": [
                f"the {len(flights)} streams it carried ended with UNAVAILABLE "
                f"{ended_after:.2f}s after the kill at the latest",
                f"{len(away)} requests while it was away: 503 in at most "
                f"{max(t for _, t in away):.2f}s",
                f"served again {back_s:.1f}s after the restart; every KV block free; gateway, "
                "scheduler and worker kept their pids",
            ],
        },
    )
    assert [(o.kind, o.error) for o in outcomes] == [(ERRORED, "unavailable")] * 4, outcomes
    assert ended_after < ENDS_WITHIN_S
    assert away and {s for s, _ in away} == {503}, away
    assert max(t for _, t in away) < 1.0
    assert freed_s < 30
    assert after == [200] * 5
    assert {name: stack.procs[name].pid for name in others} == others


def test_gateway_sigterm_drains_the_streams_in_flight(own_stack: Callable[..., Stack]):
    stack = own_stack()
    flights = [http_stream(stack, DRAINED) for _ in range(6)]
    flights += [grpc_stream(stack, DRAINED) for _ in range(2)]
    for flight in flights:
        assert flight.started.wait(60)
    gateway = stack.procs["gateway"]
    gateway.send_signal(signal.SIGTERM)
    signalled_at = time.monotonic()
    refused = []
    while gateway.poll() is None and time.monotonic() - signalled_at < 2.0:
        refused.append(complete(stack))
        time.sleep(0.1)
    outcomes = [f.wait() for f in flights]
    gateway.wait(40)
    exited_s = time.monotonic() - signalled_at
    last_s = max(f.ended_at - signalled_at for f in flights)
    stack.restart("gateway")
    eventually(lambda: complete(stack)[0] == 200, "served again by a new gateway", 60)
    result = LoadResult(outcomes)
    write_record(
        "gateway_drain",
        "gateway SIGTERM with streams in flight",
        {
            "load": f"{len(flights)} streams of {DRAINED} tokens (6 HTTP SSE, 2 gRPC)",
            "faults": ["SIGTERM to the gateway while every stream was producing tokens"],
            "outcomes": result.counts(),
            "notes": [
                f"all {result.count(COMPLETED)} streams finished, the last "
                f"{last_s:.2f}s after the SIGTERM; the gateway exited "
                f"{gateway.returncode} after {exited_s:.2f}s",
                f"{len(refused)} new requests during the drain: "
                + ", ".join(
                    f"{s or 'connection refused'}" for s in sorted({s for s, _ in refused})
                ),
            ],
        },
    )
    assert result.counts() == {COMPLETED: len(flights), ERRORED: 0, LOST: 0}, result.errors()
    assert gateway.returncode == 0
    assert {s for s, _ in refused} <= {503, 0}, refused  # never admitted, never a hang
    assert all(t < 1.0 for _, t in refused), refused
