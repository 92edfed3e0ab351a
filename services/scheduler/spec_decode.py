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


def _rfind_token_aligned(data: bytes, pattern: bytes, end: int) -> int:
    """The last byte offset of `pattern` in data[:end] that starts on a token boundary."""
    while (found := data.rfind(pattern, 0, end)) >= 0 and found % _ITEM:
        end = found + len(pattern) - 1  # the next match starts before this one
    return found
