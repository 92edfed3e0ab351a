"""Prefix caching through the real scheduler and model: requests that reuse another's KV
blocks produce exactly the greedy tokens they produce without the cache."""

from __future__ import annotations

from benchmarks.offline import OfflineEngine
from services.scheduler.scheduler import SchedulerLimits

BLOCK = 16
PREFIX = [1000 + (i * 389) % 20000 for i in range(2 * BLOCK)]  # two full blocks
PROMPTS = [
    PREFIX + [4242, 777, 31337],
    PREFIX + [9001, 12, 4096, 65],  # shares both blocks with the first
    PREFIX + [5555] * BLOCK,  # three full blocks...
    PREFIX + [5555] * BLOCK,  # ...all cached: the last one is recomputed
]
NEW_TOKENS = 8


def _generate(make_runner, caching: bool) -> tuple[list[list[int]], list[int]]:
    """One request at a time, so each can reuse what the earlier ones cached. Returns the
    tokens and each request's prefix cache hits."""
    runner = make_runner(num_blocks=64, block_size=BLOCK)
    limits = SchedulerLimits(max_num_batched_tokens=256, enable_prefix_caching=caching)
    engine = OfflineEngine(runner, limits)
    outputs, hits = [], []
    for prompt in PROMPTS:
        before = engine.scheduler.stats.num_prefix_hit_tokens
        outputs.append(engine.generate([prompt], [NEW_TOKENS])["r0"])
        hits.append(engine.scheduler.stats.num_prefix_hit_tokens - before)
    pool = engine.scheduler.kv.pool
    assert pool.num_free == pool.num_blocks  # every block came back
    return outputs, hits


def test_cached_prefixes_give_the_same_greedy_tokens_as_recomputing(make_runner):
    uncached, no_hits = _generate(make_runner, caching=False)
    cached, hits = _generate(make_runner, caching=True)
    assert no_hits == [0, 0, 0, 0]
    assert hits == [0, 2 * BLOCK, 2 * BLOCK, 2 * BLOCK]
    assert cached == uncached
