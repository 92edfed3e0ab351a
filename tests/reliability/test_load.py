"""Load: 200 streams at once, several waves of them, against a null-worker stack (the
plumbing's cost, not the model's). Every request completes or ends with a clear error, none is
lost; afterwards every KV block is free again and no process has kept growing."""

from __future__ import annotations

import asyncio

from services.stack import Stack
from tests.reliability.conftest import LOAD_NUM_BLOCKS, all_blocks_free, eventually
from tests.reliability.load import (
    COMPLETED,
    LOST,
    LoadResult,
    completion_body,
    run_streams,
    stack_rss,
)
from tests.reliability.record import write_record

STREAMS = 200
WAVES = 3  # after the warm-up wave
MAX_TOKENS = 64
# Growth allowed between the end of the warm-up wave (pools, caches and buffers at their
# 200-stream size) and the end of the last wave: generous, since allocators keep freed memory;
# a leak per request (three waves = 600 more requests' worth) would exceed it.
RSS_GROWTH_FACTOR = 1.25
RSS_GROWTH_SLACK_MIB = 32.0


def test_200_concurrent_streams_complete_and_leave_nothing_behind(load_stack: Stack):
    """200 requests of ~5 blocks fit in the pool and the batch: this loads the plumbing, not
    preemption."""
    stack = load_stack
    bodies = [completion_body(MAX_TOKENS, f"Request {i}: count slowly.") for i in range(STREAMS)]
    warm_up = asyncio.run(run_streams(stack, bodies))
    assert warm_up.count(LOST) == 0, warm_up.errors()
    eventually(lambda: all_blocks_free(stack), "every KV block free after the warm-up")
    rss_warm = stack_rss(stack)

    waves = [asyncio.run(run_streams(stack, bodies)) for _ in range(WAVES)]
    freed_s = eventually(lambda: all_blocks_free(stack), "every KV block free after the load")
    rss_after = stack_rss(stack)
    outcomes = [o for wave in waves for o in wave.outcomes]
    result = LoadResult(outcomes)
    write_record(
        "load",
        f"{STREAMS} concurrent streams, {WAVES} waves after a warm-up wave",
        {
            "load": f"{STREAMS} streaming completions at once (max_tokens {MAX_TOKENS}), "
            f"{WAVES} waves after a warm-up wave; null worker, {LOAD_NUM_BLOCKS} KV blocks",
            "outcomes": result.counts(),
            "errors": result.errors(),
            "latency": {"per stream": result.latency()},
            "rss_mib": {"after warm-up": rss_warm, "after load": rss_after},
            "notes": [
                f"all KV blocks free {freed_s:.2f}s after the last wave",
                f"bound: each process's RSS after the load <= {RSS_GROWTH_FACTOR:g}x its RSS "
                f"after the warm-up + {RSS_GROWTH_SLACK_MIB:g} MiB",
            ],
        },
    )
    assert result.count(LOST) == 0, result.errors()
    # Nothing refused either: the gateway's in-flight bound (1024) and the scheduler's queue
    # are far above 200, so an error here is a failure, not load shedding.
    assert result.count(COMPLETED) == STREAMS * WAVES, result.errors()
    assert all(o.tokens == MAX_TOKENS for o in outcomes)
    for name, warm in rss_warm.items():
        bound = warm * RSS_GROWTH_FACTOR + RSS_GROWTH_SLACK_MIB
        assert rss_after[name] <= bound, (name, warm, rss_after[name])
