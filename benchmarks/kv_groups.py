"""How many long Gemma 3 270M sequences one KV budget holds: its 18 layers in one KV cache group
(every block spans all layers, as before KV cache groups) against the worker's groups (3 global
layers, 5 groups of 3 sliding-window layers that hand back blocks behind the window), in one run:

    PYTHONPATH=. python -m benchmarks.kv_groups [--kv-gib 1] [--contexts 2048,4096,8192]
        [--requests 64] [--step-budget 2048]

The real Scheduler, KVCacheManager and BlockPool make every decision, over a pool sized by the
worker's own num_blocks_for_bytes for the real model's config; only the model is left out (each
step "samples" a fixed token: block accounting does not depend on token values). So this
measures capacity (concurrent sequences, preemptions, recomputed tokens), not speed."""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass

import torch

from services.common.gguf_file import GGUFFile
from services.common.sampling import SamplingOptions
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request
from services.scheduler.scheduler import Sample, Scheduler, SchedulerLimits
from services.worker.layers.kv_cache import KVCacheGroup, kv_cache_groups, num_blocks_for_bytes
from services.worker.model import registry
from services.worker.model.config import LlamaConfig
from services.worker.model.packaged import packaged_path

BLOCK_SIZE = 16
OUTPUT_TOKENS = 128


@dataclass(frozen=True, slots=True)
class Outcome:
    num_blocks: int
    peak_running: int  # requests holding KV at once
    preemptions: int
    recomputed_tokens: int  # tokens computed again after a preemption
    steps: int


def simulate(
    config: LlamaConfig,
    groups: list[KVCacheGroup] | None,
    kv_bytes: int,
    context: int,
    num_requests: int,
    limits: SchedulerLimits,
) -> Outcome:
    """Runs num_requests requests of `context` tokens (prompt + OUTPUT_TOKENS) to the end."""
    num_blocks = num_blocks_for_bytes(config, BLOCK_SIZE, torch.float32, kv_bytes, groups)
    windows = tuple(g.window for g in groups) if groups else (None,)
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK_SIZE, windows=windows)
    scheduler = Scheduler(limits, kv, context, frozenset())
    rng = random.Random(0)
    for i in range(num_requests):
        prompt = [rng.randrange(3, config.vocab_size) for _ in range(context - OUTPUT_TOKENS)]
        scheduler.add(Request(f"r{i}", prompt, OUTPUT_TOKENS, SamplingOptions(), frozenset()))
    peak = computed = 0
    while scheduler.has_work():
        step = scheduler.schedule()
        computed += step.num_tokens
        peak = max(peak, len(scheduler.running))
        due = [part.request for part in step.requests]
        scheduler.update(
            [Sample(r.request_id, 7) for r in due if r.num_computed_tokens == r.num_tokens]
        )
    assert kv.pool.num_free == num_blocks, "every block must come back"
    useful = num_requests * (context - 1)  # the last sampled token is never computed
    return Outcome(
        num_blocks,
        peak,
        scheduler.stats.num_preemptions,
        computed - useful,
        scheduler.stats.num_steps,
    )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.kv_groups")
    p.add_argument("--kv-gib", type=float, default=1.0, help="KV cache budget (CPU default: 1)")
    p.add_argument("--contexts", default="2048,4096,8192", help="tokens per request")
    p.add_argument("--requests", type=int, default=64, help="requests per context length")
    p.add_argument("--step-budget", type=int, default=2048, help="max_num_batched_tokens")
    args = p.parse_args()
    reader = GGUFFile(packaged_path())
    config = registry.for_gguf(reader).gguf_config(reader)
    groups = kv_cache_groups(config)
    limits = SchedulerLimits(
        max_num_batched_tokens=args.step_budget, max_num_seqs=256, enable_prefix_caching=False
    )
    kv_bytes = int(args.kv_gib * 2**30)
    print(
        f"Gemma 3 270M ({config.num_layers} layers, window {config.sliding_window}), "
        f"{args.kv_gib:g} GiB float32 KV, blocks of {BLOCK_SIZE}, {args.requests} requests of "
        f"prompt + {OUTPUT_TOKENS} output tokens per row; step budget "
        f"{limits.max_num_batched_tokens} tokens, up to {limits.max_num_seqs} running"
    )
    columns = ["context", "KV layout", "blocks", "most running at once", "preemptions",
               "tokens recomputed", "steps"]  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + " --- |" * len(columns))
    layouts = {"one group (18 layers per block)": None, "6 groups (3 layers per block)": groups}
    for context in (int(c) for c in args.contexts.split(",")):
        for name, layout in layouts.items():
            o = simulate(config, layout, kv_bytes, context, args.requests, limits)
            print(
                f"| {context} | {name} | {o.num_blocks} | {o.peak_running} | {o.preemptions} | "
                f"{o.recomputed_tokens} | {o.steps} |"
            )


if __name__ == "__main__":
    main()
