"""Speculative decoding, the scheduler's half: proposing tokens where the token history lives.

A decode step reads every weight once to produce one token per sequence; computing 1 + k
tokens of a sequence costs about as much while the step is bound by that read. So the
scheduler may append k proposed tokens ("drafts") to a decoding request's step: the worker
computes the KV and the logits at all 1 + k positions, keeps the drafts as long as they are
what it would have sampled itself, and always adds one token of its own after them
(services/worker/engine/spec_verify.py). Every accepted draft is a token for free.

A Proposer guesses the next tokens from a request's tokens (prompt and output). The n-gram
proposer (vLLM's `ngram`, transformers' prompt lookup) needs no model: it finds the last
earlier occurrence of the sequence's final n tokens and proposes what followed it there. It
pays off where the output repeats the input (summaries, rewrites, code edits, answers quoting
a retrieved passage) and proposes nothing, at no cost to the step, where nothing repeats.
"""

from __future__ import annotations

from array import array
from typing import Protocol

from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request

_ITEM = array("i").itemsize  # bytes per token id in the search buffer


class Proposer(Protocol):
    """Guesses a request's next tokens. Pure: the same tokens give the same proposal."""

    # The most tokens it proposes per step (--num-speculative-tokens).
    k: int

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        """Up to min(k, self.k) tokens likely to follow token_ids; [] when it has no guess."""
        ...


class NgramProposer:
    """Prompt lookup: the longest suffix of min_n..max_n tokens that occurred before decides;
    its most recent earlier occurrence's continuation is the proposal."""

    def __init__(self, min_n: int, max_n: int, k: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min {min_n} <= max {max_n}")
        if k < 1:
            raise ValueError(f"an n-gram proposer proposes at least 1 token, got k={k}")
        self.min_n = min_n
        self.max_n = max_n
        self.k = k

    def propose(self, token_ids: list[int], k: int) -> list[int]:
        k = min(k, self.k)
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
        # bytes.rfind searches in C: a few microseconds for thousands of tokens.
        data = array("i", token_ids).tobytes()
        for n in range(min(self.max_n, len(token_ids) - 1), self.min_n - 1, -1):
            # The match must end before the last token, so that a token follows it.
            start = _rfind_token_aligned(data, data[-n * _ITEM :], len(data) - _ITEM)
            if start >= 0:
                follows = start // _ITEM + n
                return token_ids[follows : follows + k]
        return []


class Speculator:
    """The scheduler's use of a Proposer: which decoding request gets how many proposals, and
    what the worker's verdict does to it; with the counts the metrics read.

    Proposals are budgeted like any token (the step's token budget; KV blocks allocated for
    them) but never preempt: without free blocks the request decodes one token as usual. The
    rejected ones are rolled back: the request's computed tokens end before its last known
    token, and the blocks wholly beyond them go back to the pool (the worker drops them from
    its tables by the same rule; none is cached, only verified tokens' blocks are)."""

    def __init__(self, proposer: Proposer, kv: KVCacheManager, max_model_len: int) -> None:
        self.proposer = proposer
        self.kv = kv
        self.max_model_len = max_model_len
        self.num_spec_steps = 0  # request-steps that carried proposals
        self.num_draft_tokens = 0
        self.num_accepted_tokens = 0

    def propose(self, request: Request, budget: int) -> list[list[int]] | None:
        """Proposes tokens for a decoding request and allocates its slots with them
        (request.spec_token_ids); None (no proposal, or no free blocks for it) leaves it to
        decode as usual. Call only when its last token is known (no step in flight)."""
        if request.num_tokens_to_compute != 1 or request.sampling.structured is not None:
            return None  # a prefill chunk; or a constraint the proposals would have to pass
        room = min(  # the step's own token counts against each bound
            budget - 1,
            request.max_tokens - len(request.output_token_ids) - 1,
            self.max_model_len - request.num_tokens - 1,
        )
        if room <= 0:
            return None
        request.spec_token_ids = self.proposer.propose(request.all_token_ids, room)
        if not request.spec_token_ids:
            return None
        new_blocks = self.kv.allocate_slots(request, request.num_tokens_to_compute)
        if new_blocks is None:
            request.spec_token_ids = []
        return new_blocks

    def settle(self, request: Request, num_drafts: int, num_accepted: int, kept: int) -> None:
        """The worker accepted num_accepted of the step's num_drafts proposals and the scheduler
        kept `kept` of the tokens it returned (fewer after a stop): rolls back the rest."""
        request.spec_token_ids = []
        request.num_computed_tokens -= num_drafts - (kept - 1)
        self.kv.trim(request)
        request.num_spec_steps += 1
        request.num_draft_tokens += num_drafts
        request.num_accepted_tokens += num_accepted
        self.num_spec_steps += 1
        self.num_draft_tokens += num_drafts
        self.num_accepted_tokens += num_accepted


def _rfind_token_aligned(data: bytes, pattern: bytes, end: int) -> int:
    """The last byte offset of `pattern` in data[:end] that starts on a token boundary."""
    while (found := data.rfind(pattern, 0, end)) >= 0 and found % _ITEM:
        end = found + len(pattern) - 1  # the next match starts before this one
    return found
