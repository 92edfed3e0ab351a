"""Prefix-cache hits across several scheduler replicas (issue 28): does a shared system prompt
find the worker that caches it, whichever scheduler owns that worker? Null workers, the whole
stack (`--schedulers` replicas, `--workers-per-scheduler` workers each), the tokenizer routing
across the schedulers by the Redis prefix index and load.

python -m benchmarks.scheduler_routing                 # 3 schedulers x 2 workers, Redis index
python -m benchmarks.scheduler_routing --no-redis      # the tokenizer's own memory and load only

Workload: 8 long system prompts (768-1024 token ids each) shared by 16 tenants (one API key
each); every request is one system prompt followed by its tenant's short question (16-48
ids); all requests in one shuffled order, --concurrency in flight. Hit rate = cached prompt
tokens / prompt tokens (usage.prompt_tokens_details.cached_tokens). Ideal: one cache for the
whole deployment: each system prompt computed once, every other request reusing all its full
blocks. The goal: >= 95% of ideal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.routing import BLOCK_SIZE, MODEL, free_ports, start_redis
from services.stack import Stack, StackConfig

KEYS = [f"bench-tenant-{t}" for t in range(16)]


def workload(prompts: int, tenants: int, per_pair: int, seed: int) -> tuple[list, list[int]]:
    """Shuffled (tenant, system prompt index, token ids) requests; each system prompt's length."""
    rng = random.Random(seed)
    systems = [
        [rng.randrange(1000, 40000) for _ in range(rng.randint(768, 1024))] for _ in range(prompts)
    ]
    reqs = [
        (t, p, systems[p] + [rng.randrange(1000, 40000) for _ in range(rng.randint(16, 48))])
        for t in range(tenants)
        for p in range(prompts)
        for _ in range(per_pair)
    ]
    rng.shuffle(reqs)
    return reqs, [len(s) for s in systems]


def ideal_cached(reqs: list, system_lens: list[int]) -> int:
    """Each system prompt computed once; every later request reuses its full blocks."""
    counts = [0] * len(system_lens)
    for _, p, _ in reqs:
        counts[p] += 1
    full = [(n // BLOCK_SIZE) * BLOCK_SIZE for n in system_lens]
    return sum((c - 1) * f for c, f in zip(counts, full, strict=True) if c)


async def send_all(url: str, reqs: list, concurrency: int) -> list[tuple[int, int]]:
    """(prompt tokens, cached tokens) of each request."""
    limit = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:

        async def one(tenant: int, prompt: list[int]) -> tuple[int, int]:
            async with limit:
                body = {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True}
                headers = {"Authorization": f"Bearer {KEYS[tenant]}"}
                response = await client.post("/v1/completions", json=body, headers=headers)
                response.raise_for_status()
                usage = response.json()["usage"]
                details = usage.get("prompt_tokens_details") or {}
                return usage["prompt_tokens"], details.get("cached_tokens", 0)

        return await asyncio.gather(*(one(t, ids) for t, _, ids in reqs))


def run(args, reqs: list, redis_url: str, log_dir: Path) -> tuple[list, float]:
    n, per = args.schedulers, args.workers_per_scheduler
    http, grpc_port, tok, sched, *rest = free_ports(4 + (n - 1) + n * per)
    env = {"LAYERSERVE_API_KEYS": ",".join(KEYS)}
    if redis_url:
        env["LAYERSERVE_REDIS_URL"] = redis_url
    stack = Stack(
        StackConfig(
            http_port=http,
            grpc_port=grpc_port,
            tokenizer_port=tok,
            scheduler_port=sched,
            num_schedulers=n,
            other_scheduler_ports=tuple(rest[: n - 1]),
            worker_ports=tuple(rest[n - 1 :]),
            model_name=MODEL,
            null_worker=True,
            worker_args=["--num-blocks", str(args.num_blocks)],
            log_dir=log_dir,
            env=env,
            redis="auto" if redis_url else "off",
        )
    )
    stack.start()
    try:
        started = time.perf_counter()
        outcomes = asyncio.run(send_all(stack.http_url, reqs, args.concurrency))
        return outcomes, time.perf_counter() - started
    finally:
        stack.stop()


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scheduler_routing", description=__doc__)
    p.add_argument("--schedulers", type=int, default=3)
    p.add_argument("--workers-per-scheduler", type=int, default=2)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--requests-per-pair", type=int, default=2, help="per tenant and prompt")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=4096, help="KV blocks per worker")
    p.add_argument("--no-redis", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    reqs, system_lens = workload(args.prompts, args.tenants, args.requests_per_pair, args.seed)
    redis_proc, redis_url = (None, "") if args.no_redis else start_redis()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-scheduler-routing-"))
    try:
        outcomes, wall = run(args, reqs, redis_url, log_dir)
    finally:
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
    prompt = sum(o[0] for o in outcomes)
    cached = sum(o[1] for o in outcomes)
    ideal = ideal_cached(reqs, system_lens)
    print(
        f"\n{args.schedulers} schedulers x {args.workers_per_scheduler} null workers, "
        f"{args.prompts} system prompts ({min(system_lens)}-{max(system_lens)} tokens), "
        f"{args.tenants} tenants, {len(reqs)} requests, concurrency {args.concurrency}, "
        f"{'no Redis' if args.no_redis else 'Redis index'}, {os.cpu_count()} CPUs; "
        f"logs in {log_dir}\n"
    )
    print("| prompt tokens | cached tokens | hit rate | ideal hit rate | % of ideal | wall s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {prompt} | {cached} | {100 * cached / prompt:.1f}% | {100 * ideal / prompt:.1f}% | "
        f"{100 * cached / ideal:.1f}% | {wall:.1f} |"
    )


if __name__ == "__main__":
    main()
