"""The worker's first engine step, run before it reports SERVING: a loaded model is not yet a
working one (kernels compile, memory is touched, a bad device shows up here)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from services.worker.engine.plan import NewSequence, StepPlan

WARM_UP_ID = "layerserve-warm-up"
_MAX_TOKENS = 8


class _Executes(Protocol):
    block_size: int
    vocab_size: int
    max_model_len: int

    kv_cache_groups: Sequence  # empty: one group of every layer

    def execute(self, plan: StepPlan) -> list: ...


def warm_up(runner: _Executes) -> None:
    """Prefills a few tokens into block 0 (of every KV cache group) and samples one, then
    finishes the sequence. Runs before any scheduler step (same model thread), so block 0 holds
    nothing yet; the scheduler overwrites it like any free block. Raises what the step raises."""
    num_tokens = min(_MAX_TOKENS, runner.block_size, runner.max_model_len)
    tokens = [i % runner.vocab_size for i in range(1, num_tokens + 1)]
    runner.execute(
        StepPlan(
            new=[
                NewSequence(
                    request_id=WARM_UP_ID,
                    token_ids=tokens,
                    num_prompt_tokens=num_tokens,
                    num_computed_tokens=0,
                    num_new_tokens=num_tokens,
                    block_tables=[[0] for _ in runner.kv_cache_groups or [None]],
                )
            ]
        )
    )
    runner.execute(StepPlan(finished_ids=[WARM_UP_ID]))
