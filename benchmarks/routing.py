"""KV-aware routing across worker replicas: the prefix-cache hit rate of prefix routing vs
load-only and round-robin, through the whole stack with null workers (what is measured is the
scheduler's cache accounting and the router's choices, not a model).

python -m benchmarks.routing                      # 2 replicas, 6 tenants, ample KV
python -m benchmarks.routing --num-blocks 256     # KV that holds about half the tenants

Workload: each tenant has its own system prompt of 512-1024 token ids; every request is one
tenant's prompt followed by a short user suffix (16-48 ids); the requests of all tenants come
in one shuffled order, --concurrency of them in flight. Hit rate = cached prompt tokens /
prompt tokens (usage.prompt_tokens_details.cached_tokens). Ideal: each tenant's prompt is
computed once in total and every other request of the tenant reuses all its full blocks.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from services.stack import Stack, StackConfig

API_KEY = "bench-routing"
MODEL = "smollm2-135m-instruct"
BLOCK_SIZE = 16  # the null worker's


@dataclass(frozen=True, slots=True)
class Req:
    tenant: int
    prompt: list[int]


@dataclass(frozen=True, slots=True)
class Outcome:
    prompt_tokens: int
    cached_tokens: int
    seconds: float


def workload(tenants: int, per_tenant: int, seed: int) -> tuple[list[Req], list[int]]:
    """The shuffled requests, and each tenant's system prompt length."""
    rng = random.Random(seed)
    systems = [
        [rng.randrange(1000, 40000) for _ in range(rng.randint(512, 1024))] for _ in range(tenants)
    ]
    reqs = [
        Req(t, systems[t] + [rng.randrange(1000, 40000) for _ in range(rng.randint(16, 48))])
        for t in range(tenants)
        for _ in range(per_tenant)
    ]
    rng.shuffle(reqs)
    return reqs, [len(s) for s in systems]


def ideal_cached(reqs: list[Req], system_lens: list[int]) -> int:
    counts = [0] * len(system_lens)
    for r in reqs:
        counts[r.tenant] += 1
    full_blocks = [(length // BLOCK_SIZE) * BLOCK_SIZE for length in system_lens]
    return sum((n - 1) * tokens for n, tokens in zip(counts, full_blocks, strict=True) if n)


async def send_all(url: str, reqs: list[Req], concurrency: int) -> list[Outcome]:
    limit = asyncio.Semaphore(concurrency)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as client:

        async def one(req: Req) -> Outcome:
            async with limit:
                started = time.perf_counter()
                body = {"model": MODEL, "prompt": req.prompt, "max_tokens": 8, "ignore_eos": True}
                response = await client.post("/v1/completions", json=body)
                response.raise_for_status()
                usage = response.json()["usage"]
                cached = usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
                return Outcome(usage["prompt_tokens"], cached, time.perf_counter() - started)

        return await asyncio.gather(*(one(r) for r in reqs))


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def start_redis() -> tuple[subprocess.Popen, str]:
    port = free_ports(1)[0]
    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server is not on PATH (or pass --no-redis)")
    proc = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def run_mode(mode: str, args, reqs: list[Req], redis_url: str, log_dir: Path) -> dict:
    http, grpc_port, tok, sched, *workers = free_ports(4 + args.replicas)
    worker_args = ["--num-blocks", str(args.num_blocks)] if args.num_blocks else []
    env = {"LAYERSERVE_API_KEYS": API_KEY, "LAYERSERVE_REDIS_URL": redis_url}
    stack = Stack(
        StackConfig(
            http_port=http,
            grpc_port=grpc_port,
            tokenizer_port=tok,
            scheduler_port=sched,
            worker_ports=tuple(workers),
            model_name=MODEL,
            null_worker=True,
            worker_args=worker_args,
            scheduler_args=["--routing", mode],
            log_dir=log_dir / mode,
            env=env,
        )
    )
    stack.start()
    try:
        started = time.perf_counter()
        outcomes = asyncio.run(send_all(stack.http_url, reqs, args.concurrency))
        wall = time.perf_counter() - started
    finally:
        stack.stop()
    prompt = sum(o.prompt_tokens for o in outcomes)
    cached = sum(o.cached_tokens for o in outcomes)
    latencies = sorted(o.seconds for o in outcomes)
    return {
        "mode": mode,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_rate": cached / prompt,
        "wall_s": wall,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.routing", description=__doc__)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--tenants", type=int, default=6)
    p.add_argument("--requests-per-tenant", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=0, help="KV blocks per replica (0: ample)")
    p.add_argument("--modes", default="round-robin,load,prefix")
    p.add_argument("--no-redis", action="store_true", help="route from the in-process view")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    reqs, system_lens = workload(args.tenants, args.requests_per_tenant, args.seed)
    redis_proc, redis_url = (None, "") if args.no_redis else start_redis()
    log_dir = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    try:
        rows = [run_mode(m, args, reqs, redis_url, log_dir) for m in args.modes.split(",")]
    finally:
        if redis_proc is not None:
            redis_proc.kill()
            redis_proc.wait()
    prompt = rows[0]["prompt_tokens"]
    ideal = ideal_cached(reqs, system_lens) / prompt
    kv = f"{args.num_blocks} blocks" if args.num_blocks else "ample (65536 blocks)"
    print(
        f"\n{args.replicas} replicas, {args.tenants} tenants x {args.requests_per_tenant} "
        f"requests, system prompts {min(system_lens)}-{max(system_lens)} tokens, "
        f"concurrency {args.concurrency}, KV per replica {kv}, "
        f"{'no Redis' if args.no_redis else 'Redis index'}; logs in {log_dir}\n"
    )
    print("| routing | prompt tokens | cached tokens | hit rate | % of ideal | wall s | p50 ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(
            f"| {r['mode']} | {r['prompt_tokens']} | {r['cached_tokens']} | "
            f"{100 * r['hit_rate']:.1f}% | {100 * r['hit_rate'] / ideal:.1f}% | "
            f"{r['wall_s']:.1f} | {r['p50_ms']:.0f} |"
        )
    print(f"| ideal: each tenant's prompt once | {prompt} | | {100 * ideal:.1f}% | 100% | | |")


if __name__ == "__main__":
    main()
