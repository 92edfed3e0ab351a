"""What the shared prefix index costs Redis per KV block (issue 28): memory and commands, as
the schedulers write it (services/scheduler/prefix_store.py) and the tokenizer reads it
(services/tokenizer/prefix_lookup.py). A redis-server of its own; no stack.

python -m benchmarks.prefix_index_cost                  # 8 workers x 20,000 blocks
python -m benchmarks.prefix_index_cost --workers 64 --blocks 50000

Writes: each worker stores --blocks block hashes in batches of --batch (about what one engine
step caches), then removes half of them again (eviction). Reads: --lookups routing lookups of
64 blocks against every worker. Reported: used_memory per stored block (the SET member, and the
stream entry that carries it until the stream is trimmed at 10,000 entries per worker), and
Redis commands per block written and per lookup (INFO commandstats).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random

import redis.asyncio as aioredis

from benchmarks.routing import start_redis
from services.scheduler.prefix_store import Batch, PrefixStore
from services.tokenizer.prefix_lookup import PrefixLookup


def commands(info: dict) -> int:
    return sum(v["calls"] for k, v in info.items() if k.startswith("cmdstat_"))


async def measure(url: str, args) -> dict:
    client = aioredis.Redis.from_url(url)
    store = PrefixStore(client, ttl_s=600)
    rng = random.Random(0)
    workers = [f"m@10.0.0.{i}:50061" for i in range(args.workers)]
    stored = {w: [rng.randbytes(16) for _ in range(args.blocks)] for w in workers}
    base_memory = (await client.info("memory"))["used_memory"]
    base_calls = commands(await client.info("commandstats"))
    for start in range(0, args.blocks, args.batch):
        batches = [
            Batch(w, "e", start // args.batch, stored[w][start : start + args.batch])
            for w in workers
        ]
        await store.write(batches)
    memory = (await client.info("memory"))["used_memory"] - base_memory
    writes = commands(await client.info("commandstats")) - base_calls
    removed_calls = commands(await client.info("commandstats"))
    for start in range(0, args.blocks // 2, args.batch):
        seq = args.blocks // args.batch + start // args.batch
        batches = [
            Batch(w, "e", seq, [], removed=stored[w][start : start + args.batch]) for w in workers
        ]
        await store.write(batches)
    removes = commands(await client.info("commandstats")) - removed_calls
    lookup = PrefixLookup(url)
    lookup_calls = commands(await client.info("commandstats"))
    for _ in range(args.lookups):
        w = rng.choice(workers)
        await lookup.cached_blocks(workers, stored[w][-64:])
    lookups = commands(await client.info("commandstats")) - lookup_calls
    await lookup.close()
    await client.aclose()
    total = args.workers * args.blocks
    return {
        "bytes_per_block": memory / total,
        "commands_per_block_stored": writes / total,
        "commands_per_block_removed": removes / (total / 2),
        "commands_per_lookup": lookups / args.lookups,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prefix_index_cost", description=__doc__)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--blocks", type=int, default=20_000, help="per worker")
    p.add_argument("--batch", type=int, default=8, help="blocks per write batch")
    p.add_argument("--lookups", type=int, default=1000)
    args = p.parse_args(argv)
    proc, url = start_redis()
    try:
        r = asyncio.run(measure(url, args))
    finally:
        proc.kill()
        proc.wait()
    print(
        f"\n{args.workers} workers x {args.blocks} blocks, batches of {args.batch}, "
        f"{os.cpu_count()} CPUs\n"
    )
    print("| bytes / block held | commands / block stored | / block removed | / lookup |")
    print("| ---: | ---: | ---: | ---: |")
    print(
        f"| {r['bytes_per_block']:.0f} | {r['commands_per_block_stored']:.2f} | "
        f"{r['commands_per_block_removed']:.2f} | {r['commands_per_lookup']:.1f} |"
    )


if __name__ == "__main__":
    main()
