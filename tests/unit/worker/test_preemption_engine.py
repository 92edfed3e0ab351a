"""Preemption by recompute, through the real scheduler and model: a request that runs out of KV
blocks yields, resumes later, and its greedy output is what it would have been without."""

from __future__ import annotations

from benchmarks.offline import OfflineEngine
from services.scheduler.scheduler import SchedulerLimits

PROMPTS = [
    "The history of the Roman Empire begins",
    "A recipe for bread: first, take",
    "def quicksort(items):",
    "The tallest mountains in the world are",
]
NEW_TOKENS = 24


def _generate(make_runner, tokenizer, num_blocks: int) -> tuple[list[list[int]], int]:
    runner = make_runner(num_blocks=num_blocks, block_size=4)
    engine = OfflineEngine(runner, SchedulerLimits(max_num_batched_tokens=64, max_num_seqs=8))
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    out = engine.generate(prompts, [NEW_TOKENS] * len(prompts))
    pool = engine.scheduler.kv.pool
    assert pool.num_free == pool.num_blocks  # every block came back
    return [out[f"r{i}"] for i in range(len(prompts))], engine.scheduler.stats.num_preemptions


def test_preempted_requests_resume_with_identical_greedy_output(make_runner, tokenizer):
    roomy, roomy_preemptions = _generate(make_runner, tokenizer, num_blocks=256)
    # 4 requests of ~32 tokens need ~32 blocks of 4 at the end: 20 forces preemptions.
    tight, tight_preemptions = _generate(make_runner, tokenizer, num_blocks=20)
    assert roomy_preemptions == 0
    assert tight_preemptions > 0
    assert tight == roomy
