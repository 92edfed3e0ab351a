"""L3 and plumbing: the same workload through the gateway's OpenAI API, streaming, all
requests in flight at once; the client is this process (aiohttp), the stack is four others."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field

import aiohttp

from benchmarks.workload import Item


@dataclass
class RequestTiming:
    sent: float
    first_token: float = 0.0
    chunk_times: list[float] = field(default_factory=list)
    done: float = 0.0
    completion_tokens: int = 0


async def _one(session: aiohttp.ClientSession, url: str, model: str, item: Item) -> RequestTiming:
    body = {
        "model": model,
        "prompt": item.prompt_ids,
        "max_tokens": item.output_len,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    timing = RequestTiming(sent=time.perf_counter())
    async with session.post(f"{url}/v1/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        async for raw in response.content:
            # Only the usage chunk is parsed: the load generator shares the CPU with the stack
            # it measures, so it does the least it can per chunk.
            if not raw.startswith(b"data: ") or raw.startswith(b"data: [DONE]"):
                continue
            now = time.perf_counter()
            if b'"usage":{' in raw:
                usage = json.loads(raw[6:])["usage"]
                timing.completion_tokens = usage["completion_tokens"]
            elif b'"text":""' not in raw:
                if not timing.first_token:
                    timing.first_token = now
                timing.chunk_times.append(now)
    timing.done = time.perf_counter()
    return timing


async def run_through_gateway(
    url: str, model: str, items: list[Item], concurrency: int | None = None
) -> dict:
    """Sends every item (at most `concurrency` in flight) and reports throughput and latency."""
    limit = asyncio.Semaphore(concurrency or len(items))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def bounded(item: Item) -> RequestTiming:
            async with limit:
                return await _one(session, url, model, item)

        started = time.perf_counter()
        timings = await asyncio.gather(*(bounded(item) for item in items))
        wall = time.perf_counter() - started
    return summarize(timings, wall)


def _ms(values: list[float]) -> dict:
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    ordered = sorted(values)
    return {
        "mean": 1000 * statistics.fmean(ordered),
        "p50": 1000 * ordered[len(ordered) // 2],
        "p99": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
    }


def summarize(timings: list[RequestTiming], wall: float) -> dict:
    tokens = sum(t.completion_tokens for t in timings)
    gaps = [b - a for t in timings for a, b in zip(t.chunk_times, t.chunk_times[1:], strict=False)]
    tpot = [(t.done - t.first_token) / max(1, t.completion_tokens - 1) for t in timings]
    return {
        "requests": len(timings),
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tok_s": tokens / wall,
        "requests_s": len(timings) / wall,
        "ttft_ms": _ms([t.first_token - t.sent for t in timings]),
        "tpot_ms": _ms(tpot),
        "itl_ms": _ms(gaps),
        "e2e_ms": _ms([t.done - t.sent for t in timings]),
    }
