"""A soak: steady streaming load on a null-worker stack for `--soak-seconds` (or
LAYERSERVE_SOAK_SECONDS; 30 by default, for CI: the shortest whose thirds are compared). No
request is lost, and memory and latency stay flat: the last third of the run is compared with
the first, each third with about 10 RSS samples."""

from __future__ import annotations

import asyncio
import statistics
import time

from services.stack import Stack
from tests.reliability.conftest import all_blocks_free, eventually
from tests.reliability.load import (
    COMPLETED,
    LOST,
    LoadResult,
    Outcome,
    completion_body,
    new_client,
    stack_rss,
    stream_once,
)
from tests.reliability.record import write_record

CLIENTS = 16
MAX_TOKENS = 32
RSS_EVERY_S = 1.0
# Flat, with room for a shared 2-core machine's noise: the last third's median latency at most
# twice the first third's, and each process's mean RSS at most 15% + 16 MiB above it.
LATENCY_FACTOR = 2.0
RSS_FACTOR, RSS_SLACK_MIB = 1.15, 16.0


async def soak(stack: Stack, seconds: float) -> tuple[list[tuple[float, Outcome]], list]:
    """Runs the load; returns (start offset, outcome) per request and (offset, RSS) samples."""
    url = f"{stack.http_url}/v1/completions"
    begin = time.monotonic()
    end = begin + seconds
    requests: list[tuple[float, Outcome]] = []
    samples: list[tuple[float, dict[str, float]]] = []

    async def client(index: int, http) -> None:
        i = 0
        while time.monotonic() < end:
            sent = time.monotonic() - begin
            body = completion_body(MAX_TOKENS, f"Client {index}, request {i}: count.")
            requests.append((sent, await stream_once(http, url, body)))
            i += 1

    async def sampler() -> None:
        while time.monotonic() < end:
            samples.append((time.monotonic() - begin, stack_rss(stack)))
            await asyncio.sleep(RSS_EVERY_S)

    async with new_client(60) as http:
        await asyncio.gather(sampler(), *(client(i, http) for i in range(CLIENTS)))
    return requests, samples


def thirds(items: list[tuple[float, object]], seconds: float) -> tuple[list, list]:
    """The items of the first and of the last third of the run, by their offset."""
    first = [item for t, item in items if t < seconds / 3]
    last = [item for t, item in items if t >= 2 * seconds / 3]
    return first, last


def test_memory_and_latency_stay_flat_under_steady_load(load_stack: Stack, soak_seconds: float):
    stack = load_stack
    asyncio.run(soak(stack, 5.0))  # warm-up: pools and caches at their working size
    requests, samples = asyncio.run(soak(stack, soak_seconds))
    eventually(lambda: all_blocks_free(stack), "every KV block free after the soak")
    result = LoadResult([o for _, o in requests])
    first, last = (
        LoadResult([o for o in part if o.kind == COMPLETED])
        for part in thirds(requests, soak_seconds)
    )
    rss_first, rss_last = (
        {name: round(statistics.mean(s[name] for s in part), 1) for name in samples[0][1]}
        for part in thirds(samples, soak_seconds)
    )
    write_record(
        "soak",
        f"soak of {soak_seconds:g}s",
        {
            "load": f"{CLIENTS} clients sending streaming completions (max_tokens {MAX_TOKENS}) "
            f"back to back for {soak_seconds:g}s; null worker",
            "outcomes": result.counts(),
            "errors": result.errors(),
            "latency": {"first third": first.latency(), "last third": last.latency()},
            "rss_mib": {"first third (mean)": rss_first, "last third (mean)": rss_last},
            "notes": [
                f"{len(requests) / soak_seconds:.1f} requests/s",
                f"bounds: last-third p50 latency <= {LATENCY_FACTOR:g}x the first third's; "
                f"mean RSS <= {RSS_FACTOR:g}x + {RSS_SLACK_MIB:g} MiB",
            ],
        },
    )
    assert result.count(LOST) == 0, result.errors()
    assert result.count(COMPLETED) == len(requests), result.errors()
    assert first.outcomes and last.outcomes
    assert last.latency()["p50_s"] <= LATENCY_FACTOR * first.latency()["p50_s"]
    for name, mib in rss_first.items():
        assert rss_last[name] <= RSS_FACTOR * mib + RSS_SLACK_MIB, (name, mib, rss_last[name])
