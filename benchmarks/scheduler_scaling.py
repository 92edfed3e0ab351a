"""What each tier costs, and how throughput scales with scheduler replicas (issue 28). Null
workers (no model: what is measured is the plumbing), the whole stack started with 1, 2 and 3
schedulers and the same workers in total, requests through the gateway's gRPC API.

python -m benchmarks.scheduler_scaling                       # 1,2,3 schedulers, 6 workers
python -m benchmarks.scheduler_scaling --schedulers 1,3 --requests 2000 --concurrency 256

Per stack: one run of --requests requests of 1 token, one of --tokens tokens, each process's
CPU time (user + system, psutil) read before and after. Per tier (gateway, tokenizer, the
schedulers together, the workers together): CPU per request = the 1-token run's CPU / requests;
CPU per token = the difference of the two runs / the extra tokens. Throughput: output tokens per
second of wall time in the long run. The client runs in this process: on a small machine it
competes with the stack (the numbers say so: --cpus in the header).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path

import grpc
import psutil

from benchmarks.routing import MODEL, free_ports
from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.stack import Stack, StackConfig

API_KEY = "bench-scaling"
TIERS = ("gateway", "tokenizer", "scheduler", "worker")


def start(schedulers: int, workers: int, log_dir: Path) -> Stack:
    http, grpc_port, tok, sched, *rest = free_ports(4 + (schedulers - 1) + workers)
    stack = Stack(
        StackConfig(
            http_port=http,
            grpc_port=grpc_port,
            tokenizer_port=tok,
            scheduler_port=sched,
            num_schedulers=schedulers,
            other_scheduler_ports=tuple(rest[: schedulers - 1]),
            worker_ports=tuple(rest[schedulers - 1 :]),
            model_name=MODEL,
            null_worker=True,
            worker_args=["--num-blocks", "8192"],
            scheduler_args=["--max-num-seqs", "256"],
            log_dir=log_dir,
            env={"LAYERSERVE_API_KEYS": API_KEY},
            redis="off",
        )
    )
    stack.start()
    return stack


def cpu_by_tier(stack: Stack) -> dict[str, float]:
    seconds = dict.fromkeys(TIERS, 0.0)
    for name, proc in stack.procs.items():
        tier = name.rstrip("0123456789")
        if tier in seconds:
            times = psutil.Process(proc.pid).cpu_times()
            seconds[tier] += times.user + times.system
    return seconds


async def load(port: int, requests: int, tokens: int, concurrency: int) -> int:
    """Output tokens received."""
    limit = asyncio.Semaphore(concurrency)
    metadata = (("authorization", f"Bearer {API_KEY}"),)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_pb2_grpc.GatewayStub(channel)

        async def one(i: int) -> int:
            request = gateway_pb2.GenerateRequest(
                model=MODEL, prompt=f"request {i} counts", max_tokens=tokens, ignore_eos=True
            )
            async with limit:
                got = 0
                async for response in stub.Generate(request, metadata=metadata, timeout=600):
                    got += len(response.token_ids)
                return got

        return sum(await asyncio.gather(*(one(i) for i in range(requests))))


def measure(stack: Stack, args) -> dict:
    port = stack.config.grpc_port
    asyncio.run(load(port, 32, 4, 8))  # warm every path
    before = cpu_by_tier(stack)
    asyncio.run(load(port, args.requests, 1, args.concurrency))
    mid = cpu_by_tier(stack)
    started = time.perf_counter()
    produced = asyncio.run(load(port, args.requests, args.tokens, args.concurrency))
    wall = time.perf_counter() - started
    after = cpu_by_tier(stack)
    extra_tokens = args.requests * (args.tokens - 1)
    return {
        "per_request_ms": {t: 1000 * (mid[t] - before[t]) / args.requests for t in TIERS},
        "per_token_us": {
            t: 1e6 * ((after[t] - mid[t]) - (mid[t] - before[t])) / extra_tokens for t in TIERS
        },
        "tokens_per_s": produced / wall,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scheduler_scaling", description=__doc__)
    p.add_argument("--schedulers", default="1,2,3", help="comma-separated replica counts")
    p.add_argument("--workers", type=int, default=6, help="null workers in total")
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=128)
    args = p.parse_args(argv)
    log_root = Path(tempfile.mkdtemp(prefix="bench-scheduler-scaling-"))
    rows = []
    for n in (int(x) for x in args.schedulers.split(",")):
        stack = start(n, args.workers, log_root / f"{n}")
        try:
            rows.append((n, measure(stack, args)))
        finally:
            stack.stop()
    print(
        f"\n{args.workers} null workers, {args.requests} requests x {args.tokens} tokens, "
        f"concurrency {args.concurrency}, {os.cpu_count()} CPUs; logs in {log_root}\n"
    )
    head = " | ".join(f"{t} ms/req, us/token" for t in TIERS)
    print(f"| schedulers | {head} | tokens/s |")
    print("| ---: |" + " ---: |" * (len(TIERS) + 1))
    for n, r in rows:
        cells = " | ".join(
            f"{r['per_request_ms'][t]:.2f}, {r['per_token_us'][t]:.0f}" for t in TIERS
        )
        print(f"| {n} | {cells} | {r['tokens_per_s']:.0f} |")


if __name__ == "__main__":
    main()
