"""The worker-kill fault on the real model (SmolLM2-135M on the CPU), not only the null
worker: one of two replicas SIGKILLed while both stream; its requests end with UNAVAILABLE
within seconds, the survivor's finish, new requests are served by the survivor, and the killed
worker, started again, loads the model, rejoins and serves."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import httpx

from services.stack import Stack
from tests.e2e.conftest import free_ports
from tests.reliability.conftest import AUTH, MODEL, all_worker_stats, eventually
from tests.reliability.in_flight import InFlight, launch
from tests.reliability.load import COMPLETED, ERRORED, LOST, LoadResult, Outcome
from tests.reliability.record import write_record

TOKENS = 96  # ignore_eos: every stream is still running when the kill lands
ENDS_WITHIN_S = 5.0
REJOIN_WITHIN_S = 120.0


def real_stream(stack: Stack, max_tokens: int) -> InFlight:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about rivers."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }

    def run(flight: InFlight) -> Outcome:
        began = time.monotonic()
        url = f"{stack.http_url}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=AUTH, timeout=120) as response:
            assert response.status_code == 200, response.read()
            finish = None
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                flight.started.set()
                if line == "data: [DONE]":
                    return Outcome(COMPLETED if finish else LOST, time.monotonic() - began)
                event = json.loads(line[len("data: ") :])
                if "error" in event:
                    error = event["error"]["code"]
                    return Outcome(ERRORED, time.monotonic() - began, error=error)
                finish = event["choices"][0]["finish_reason"] or finish
        return Outcome(LOST, time.monotonic() - began, error="no [DONE]")

    return launch(run)


def complete(stack: Stack) -> int:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    url = f"{stack.http_url}/v1/chat/completions"
    return httpx.post(url, json=body, headers=AUTH, timeout=120).status_code


def test_killed_replica_of_the_real_model_fails_its_streams_fast_and_rejoins(
    own_stack: Callable[..., Stack],
):
    stack = own_stack(
        null_worker=False,
        worker_ports=tuple(free_ports(2)),
        worker_args=["--device", "cpu", "--num-blocks", "256"],
        scheduler_args=["--routing", "round-robin"],
        ready_timeout=300,
    )
    # Round-robin spreads the streams over both replicas only once the scheduler holds both (a
    # stack is ready with one): else every stream can land on the one killed.
    eventually(lambda: len(all_worker_stats(stack)) == 2, "both workers connected", 60)
    flights = [real_stream(stack, TOKENS) for _ in range(4)]
    for flight in flights:
        assert flight.started.wait(120), "a stream never started"
    assert all(f.outcome is None for f in flights), "a stream ended before the kill"
    killed_at = time.monotonic()
    stack.kill("worker0")
    outcomes = [f.wait(180) for f in flights]
    failed = [f for f, o in zip(flights, outcomes, strict=True) if o.kind == ERRORED]
    ended_after = max(f.ended_at - killed_at for f in failed) if failed else 0.0
    after_kill = [complete(stack) for _ in range(2)]
    stack.restart("worker0")
    restarted_at = time.monotonic()
    address = f"127.0.0.1:{stack.config.worker_ports[0]}"
    eventually(lambda: address in all_worker_stats(stack), "worker0 rejoined", REJOIN_WITHIN_S)
    rejoin_s = time.monotonic() - restarted_at
    after_rejoin = [complete(stack) for _ in range(2)]
    result = LoadResult(outcomes)
    write_record(
        "worker_kill_real_model",
        "SIGKILL of one of two real-model replicas mid-stream",
        {
            "load": f"4 chat streams of {TOKENS} tokens (ignore_eos) on two SmolLM2-135M "
            "workers on the CPU, round-robin",
            "faults": ["SIGKILL to worker0 while every stream was producing tokens"],
            "outcomes": result.counts(),
            "errors": result.errors(),
            "notes": [
                f"the killed replica's {len(failed)} streams ended with UNAVAILABLE "
                f"{ended_after:.2f}s after the kill at the latest; the survivor's "
                f"{result.count(COMPLETED)} completed",
                f"{after_kill.count(200)} of {len(after_kill)} new requests after the kill "
                "answered 200",
                f"the restarted worker loaded the model and rejoined in {rejoin_s:.1f}s; "
                f"{after_rejoin.count(200)} of {len(after_rejoin)} requests after answered 200",
            ],
        },
    )
    assert result.count(LOST) == 0, outcomes
    assert 0 < len(failed) < len(flights), outcomes
    assert {o.error for o in outcomes if o.kind == ERRORED} == {"unavailable"}, outcomes
    assert ended_after < ENDS_WITHIN_S
    assert after_kill == [200] * 2
    assert after_rejoin == [200] * 2
