"""Admission limits at their edge under load: what is over a limit is refused at once, and
what was admitted is served as if nothing happened.

- the gateway at its in-flight bound (--max-inflight): the excess gets 503 with Retry-After
  at once, the admitted streams all complete;
- a key at its concurrency limit (--default-max-concurrent): its excess gets 429 with
  Retry-After at once, while another key's requests, sent at the same time, all complete.

"At once" is an order, not a wall-clock figure: every refusal is answered while all the
admitted streams still run, so none waited for a slot to free. The admitted streams keep the
gateway busy (null-worker tokens as fast as it can send them), and on a saturated 2-core
machine a refusal took up to a second there: a bound in seconds measured the machine.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.stack import Stack
from tests.reliability.conftest import API_KEY, all_blocks_free, eventually
from tests.reliability.load import (
    COMPLETED,
    ERRORED,
    LOST,
    LoadResult,
    Outcome,
    completion_body,
    new_client,
)
from tests.reliability.load import _read_stream as read_stream
from tests.reliability.load import _refused as refused_outcome
from tests.reliability.record import write_record

# Tokens: seconds of null-worker output, outlasting the burst sent against them (refused in
# ~0.2 s on a quiet machine). 2000 ran ~2 s for the 8 admitted streams on a 2-core machine at
# load 4, ten times the burst; 4000 only added that much again to the test's time.
LONG = 2000
SHORT = 8
OTHER_KEY = "reliability-test-other-key"


@dataclass
class Answer:
    outcome: Outcome
    retry_after: str  # the Retry-After it was refused with
    ended_at: float  # time.monotonic() when its last byte came


async def stream(
    client, url: str, body: dict, key: str, admitted: asyncio.Event | None = None
) -> Answer:
    """One streaming completion. `admitted` is set once the gateway has answered 200."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    async with client.stream("POST", url, json=body, headers=headers) as response:
        if admitted is not None and response.status_code == 200:
            admitted.set()
        if response.status_code != 200:
            outcome = refused_outcome(response.status_code, await response.aread(), started)
            retry_after = response.headers.get("Retry-After", "")
        else:
            outcome, retry_after = await read_stream(response, started), ""
    return Answer(outcome, retry_after, time.monotonic())


def assert_refused_at_once(refused: list[Answer], admitted: list[Answer]) -> None:
    """Every refusal came while all the admitted streams still ran."""
    last_refusal = max(a.ended_at for a in refused)
    first_end = min(a.ended_at for a in admitted)
    assert last_refusal < first_end, (
        f"a refusal came {last_refusal - first_end:.3f}s after an admitted stream ended"
    )


async def burst(stack: Stack, admitted: list[tuple[str, int]], excess: list[tuple[str, int]]):
    """Starts the `admitted` (key, max_tokens) streams, waits until they run, then sends the
    `excess` all at once; returns both lists' answers."""
    url = f"{stack.http_url}/v1/completions"
    async with new_client(120) as client:
        events = [asyncio.Event() for _ in admitted]
        first = [
            asyncio.create_task(stream(client, url, completion_body(n), key, event))
            for (key, n), event in zip(admitted, events, strict=True)
        ]
        # Every admitted stream in flight (answered 200; none can finish for seconds).
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 60)
        second = await asyncio.gather(
            *(stream(client, url, completion_body(n), key) for key, n in excess)
        )
        return await asyncio.gather(*first), second


def test_the_gateway_at_its_in_flight_bound_refuses_the_excess_fast(
    own_stack: Callable[..., Stack],
):
    bound = 8
    stack = own_stack(gateway_args=["--max-inflight", str(bound)])
    admitted, excess = asyncio.run(
        burst(stack, [(API_KEY, LONG)] * bound, [(API_KEY, SHORT)] * (3 * bound))
    )
    admitted_result = LoadResult([a.outcome for a in admitted])
    refused = [a for a in excess if a.outcome.http_status == 503]
    eventually(lambda: all_blocks_free(stack), "every KV block free")
    write_record(
        "inflight_limit",
        "the gateway at its in-flight bound",
        {
            "load": f"{bound} streams of {LONG} tokens admitted (--max-inflight {bound}), then "
            f"{len(excess)} more requests at once",
            "faults": [f"the gateway full: {bound} requests in flight, its bound"],
            "outcomes": LoadResult([a.outcome for a in admitted + excess]).counts(),
            "errors": LoadResult([a.outcome for a in excess]).errors(),
            "notes": [
                f"all {admitted_result.count(COMPLETED)} admitted streams completed",
                f"{len(refused)} of {len(excess)} excess requests refused with 503 and "
                f"Retry-After, the slowest in {max(a.outcome.seconds for a in refused):.3f}s",
            ],
        },
    )
    assert admitted_result.counts() == {COMPLETED: bound, ERRORED: 0, LOST: 0}
    assert len(refused) == len(excess), LoadResult([a.outcome for a in excess]).errors()
    assert all(a.retry_after for a in refused)
    assert_refused_at_once(refused, admitted)


def test_a_key_at_its_concurrency_limit_gets_429_fast_and_others_are_served(
    own_stack: Callable[..., Stack],
):
    limit = 4
    stack = own_stack(
        env={"LAYERSERVE_API_KEYS": f"{API_KEY},{OTHER_KEY}"},
        gateway_args=["--default-max-concurrent", str(limit)],
    )
    admitted = [(API_KEY, LONG)] * limit
    excess = [(API_KEY, SHORT)] * (3 * limit) + [(OTHER_KEY, SHORT)] * limit
    first, second = asyncio.run(burst(stack, admitted, excess))
    keyed = [(key, answer) for answer, (key, _) in zip(second, excess, strict=True)]
    greedy = [answer for key, answer in keyed if key == API_KEY]
    other = LoadResult([a.outcome for key, a in keyed if key == OTHER_KEY])
    admitted_result = LoadResult([a.outcome for a in first])
    refused = [a for a in greedy if a.outcome.http_status == 429]
    eventually(lambda: all_blocks_free(stack), "every KV block free")
    write_record(
        "key_concurrency_limit",
        "a key at its concurrency limit",
        {
            "load": f"key A: {limit} streams of {LONG} tokens admitted (max_concurrent "
            f"{limit}), then {len(greedy)} more from A and {limit} from key B at once",
            "faults": [f"key A at its concurrency limit ({limit} in flight)"],
            "outcomes": LoadResult([a.outcome for a in first + second]).counts(),
            "errors": LoadResult([a.outcome for a in greedy]).errors(),
            "notes": [
                f"A's {admitted_result.count(COMPLETED)} admitted streams completed",
                f"{len(refused)} of A's {len(greedy)} excess requests refused with 429 and "
                f"Retry-After, the slowest in {max(a.outcome.seconds for a in refused):.3f}s",
                f"B's {other.count(COMPLETED)} of {limit} requests completed "
                f"(p90 {other.latency().get('p90_s', 0):.2f}s)",
            ],
        },
    )
    assert admitted_result.counts() == {COMPLETED: limit, ERRORED: 0, LOST: 0}
    assert len(refused) == len(greedy), LoadResult([a.outcome for a in greedy]).errors()
    assert all(a.retry_after for a in refused)
    assert_refused_at_once(refused, first)
    assert other.counts() == {COMPLETED: limit, ERRORED: 0, LOST: 0}, other.errors()
