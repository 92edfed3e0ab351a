"""Inter-token latency of running requests while a long prompt arrives, chunked prefill on vs
off, in one run:  python -m benchmarks.chunked [--long 4096] [--chunk 512]

"Off" is a step budget large enough to prefill the whole prompt in one step; "on" splits it
into chunks of --chunk tokens that share each step with the running decodes."""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from benchmarks.offline import to_plan
from services.common.sampling import SamplingOptions
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request
from services.scheduler.scheduler import Sample, Scheduler, SchedulerLimits
from services.worker.engine.model_runner import ModelRunner
from services.worker.layers.attention_backends import torch_backend
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loader import default_path, load_model


def run(loaded, budget: int, long_len: int, decoders: int, seed: int = 0) -> dict:
    cache = PagedKVCache(loaded.config, 2048, 16, torch.float32, torch.device("cpu"))
    runner = ModelRunner(
        loaded, cache, max_model_len=8192, model_name="bench", backend=torch_backend()
    )
    kv = KVCacheManager(BlockPool(runner.num_blocks), runner.block_size)
    sched = Scheduler(SchedulerLimits(budget, 64), kv, 8192, frozenset())
    rng = random.Random(seed)
    for i in range(decoders):
        prompt = [rng.randint(1000, 40000) for _ in range(64)]
        sched.add(Request(f"d{i}", prompt, 10_000, SamplingOptions(), frozenset()))
    long_prompt = [rng.randint(1000, 40000) for _ in range(long_len)]
    last_token: dict[str, float] = {}
    gaps: list[float] = []
    arrived = first_token = None
    for step_index in range(10_000):
        if step_index == 3:
            arrived = time.perf_counter()
            sched.add(Request("long", long_prompt, 1, SamplingOptions(), frozenset()))
        step = sched.schedule()
        sampled = runner.execute(to_plan(step))
        now = time.perf_counter()
        for s in sampled:
            if s.request_id == "long":
                first_token = now
            elif arrived is not None and s.request_id in last_token:
                gaps.append(now - last_token[s.request_id])
            last_token[s.request_id] = now
        sched.update([Sample(s.request_id, s.token_id) for s in sampled])
        if first_token is not None:
            break
    return {
        "budget": budget,
        "itl_max_ms": 1000 * max(gaps),
        "itl_mean_ms": 1000 * statistics.fmean(gaps),
        "long_ttft_s": first_token - arrived,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.chunked")
    p.add_argument("--long", type=int, default=4096, help="tokens in the arriving prompt")
    p.add_argument("--chunk", type=int, default=512, help="step budget with chunked prefill")
    p.add_argument("--decoders", type=int, default=8, help="requests decoding meanwhile")
    args = p.parse_args()
    loaded = load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.decoders} "
        f"requests decoding while a {args.long}-token prompt arrives"
    )
    rows = [
        ("on", run(loaded, args.chunk, args.long, args.decoders)),
        ("off", run(loaded, args.long + args.decoders, args.long, args.decoders)),
    ]
    print("| chunked prefill | step budget | ITL max | ITL mean | TTFT of the long prompt |")
    print("| --- | --- | --- | --- | --- |")
    for name, r in rows:
        print(
            f"| {name} | {r['budget']} | {r['itl_max_ms']:.0f} ms | {r['itl_mean_ms']:.0f} ms "
            f"| {r['long_ttft_s']:.2f} s |"
        )


if __name__ == "__main__":
    main()
