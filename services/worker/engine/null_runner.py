"""A worker without a model: same protocol and bookkeeping, tokens from a fixed rule.

It measures the plumbing (scheduler, tokenizer, gateway and the hops between them) with the
model's cost taken out: `python -m services.worker --null`. With step_seconds (--null-step-
seconds) each step also spends that long asleep on the model thread, a stand-in for a device
busy with the step while the host is free: what benchmarks/async_overlap.py overlaps.

Its next token is a function of the sequence so far (next_token: of the last token and the
position), never of how many tokens this worker produced: a request resubmitted with its
prompt and the tokens already sent (after a preemption, or migrated to another worker)
continues with exactly the tokens of an uninterrupted run, as a greedy model would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from services.worker.engine.plan import Sampled, StepPlan

# Ids of common single-word tokens in the SmolLM2 vocabulary would tie this to one model; any
# ids below the vocabulary size (and past the special tokens) work, the tokenizer renders
# whatever they are.
FIRST_TOKEN = 300
NUM_TOKENS = 1000  # tokens FIRST_TOKEN .. FIRST_TOKEN + NUM_TOKENS - 1


def next_token(last_token: int, position: int) -> int:
    """The token at `position` (0-based: the sequence's length so far) after `last_token`."""
    return FIRST_TOKEN + (31 * last_token + 17 * position) % NUM_TOKENS


def continuation(token_ids: Sequence[int], count: int) -> list[int]:
    """The `count` tokens a null worker produces after `token_ids` (a non-empty sequence)."""
    tokens = list(token_ids)
    for _ in range(count):
        tokens.append(next_token(tokens[-1], len(tokens)))
    return tokens[len(token_ids) :]


@dataclass(slots=True)
class _Sequence:
    num_tokens: int
    num_computed: int
    last_token: int


class NullRunner:
    model_name = "null"
    fingerprint = "null"
    device = "cpu"
    dtype = "none"
    kernels = "none"
    kv_cache_groups = ()  # one group of every layer: one block table per sequence

    def __init__(
        self,
        *,
        block_size: int = 16,
        num_blocks: int = 65536,
        max_model_len: int = 8192,
        step_seconds: float = 0.0,
    ) -> None:
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_model_len = max_model_len
        self.vocab_size = 49152
        self.eos_token_ids: tuple[int, ...] = ()
        self._sequences: dict[str, _Sequence] = {}
        self.step_seconds = step_seconds  # the stand-in device's time per step that computes

    def _compute(self) -> None:
        """The device's share of a step: the thread sleeps (the GIL is free, as in a kernel)."""
        if self.step_seconds > 0:
            time.sleep(self.step_seconds)

    def execute(self, plan: StepPlan) -> list[Sampled]:
        for request_id in plan.finished_ids:
            self._sequences.pop(request_id, None)
        scheduled: list[tuple[str, int]] = []
        for new in plan.new:
            self._sequences[new.request_id] = _Sequence(
                len(new.token_ids), new.num_computed_tokens, new.token_ids[-1]
            )
            scheduled.append((new.request_id, new.num_new_tokens))
        for running in plan.running:
            if running.request_id not in self._sequences:
                raise ValueError(f"unknown request {running.request_id!r}")
            # Proposed tokens are computed and all rejected: one token of its own follows.
            self._sequences[running.request_id].num_computed -= len(running.draft_token_ids)
            scheduled.append((running.request_id, running.num_new_tokens))
        if any(num_new for _, num_new in scheduled):
            self._compute()
        sampled = []
        for request_id, num_new in scheduled:
            seq = self._sequences[request_id]
            seq.num_computed += num_new
            if seq.num_computed >= seq.num_tokens:
                token = next_token(seq.last_token, seq.num_tokens)
                seq.last_token = token
                seq.num_tokens += 1
                sampled.append(Sampled(request_id, token))
        return sampled
