"""L3 and plumbing: a workload through the gateway's OpenAI API, streaming; the client is this
process (aiohttp), the stack is four others. Requests go out all at once, at most
`concurrency` in flight, or at given send times (Poisson arrivals)."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from benchmarks.metrics import RequestTiming, Slo, summarize
from benchmarks.sampling import GREEDY, Sampling, request_seeds
from benchmarks.workload import Item


def request_body(model: str, item: Item, sampling: Sampling, seed: int) -> dict:
    """The /v1/completions body: the prompt's token ids, exactly output_len tokens (EOS
    ignored), streaming, sampled as `sampling` says with its own seed (greedy: no seed)."""
    body = {
        "model": model,
        "prompt": item.prompt_ids,
        "max_tokens": item.output_len,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not sampling.greedy:
        body["seed"] = seed
    return body


async def _one(session: aiohttp.ClientSession, url: str, body: dict) -> RequestTiming:
    item_len = body["max_tokens"]
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
    if timing.completion_tokens != item_len:
        raise RuntimeError(
            f"asked for {item_len} tokens (EOS ignored), got {timing.completion_tokens}"
        )
    return timing


async def run_through_gateway(
    url: str,
    model: str,
    items: list[Item],
    concurrency: int | None = None,
    send_at: list[float] | None = None,
    slo: Slo | None = None,
    sampling: Sampling = GREEDY,
    seed: int = 0,
) -> dict:
    """Sends every item, at most `concurrency` in flight (None: no limit), item i not before
    send_at[i] seconds from the start when given, sampled as `sampling` says with a seed per
    request (benchmarks.sampling.request_seeds(seed, ...)), and summarizes (benchmarks.metrics)."""
    if send_at is not None and len(send_at) != len(items):
        raise ValueError(f"{len(send_at)} send times for {len(items)} items")
    seeds = request_seeds(seed, len(items))
    limit = asyncio.Semaphore(concurrency or len(items))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.perf_counter()

        async def scheduled(i: int, item: Item) -> RequestTiming:
            if send_at is not None:
                await asyncio.sleep(max(0.0, started + send_at[i] - time.perf_counter()))
            async with limit:
                return await _one(session, url, request_body(model, item, sampling, seeds[i]))

        timings = await asyncio.gather(*(scheduled(i, item) for i, item in enumerate(items)))
        wall = time.perf_counter() - started
    return summarize(list(timings), wall, slo)
