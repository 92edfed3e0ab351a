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
from services.scheduler.spec_policy import Acceptance, StepCost, choose
from services.scheduler.step import ScheduledStep

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
    what the worker's verdict does to it.

    Each step (plan()) every decoding request is offered the proposer's guess, and takes as
    much of it as pays for itself given its acceptance so far and what a token costs the step
    (spec_policy.py): up to k proposals where they are accepted and tokens are cheap, none
    where they are rejected or the step is already costly. The steps' times come from the
    scheduler (sent() / done()).

    Proposals are budgeted like any token (the step's token budget; KV blocks allocated for
    them) but never preempt: without free blocks the request decodes one token as usual. The
    rejected ones are rolled back: the request's computed tokens end before its last known
    token, and the blocks wholly beyond them go back to the pool (the worker drops them from
    its tables by the same rule; none is cached, only verified tokens' blocks are)."""

    def __init__(
        self, proposer: Proposer, kv: KVCacheManager, max_model_len: int, adaptive: bool = True
    ) -> None:
        """adaptive False: every decoding request takes all the proposer finds (up to k)."""
        self.proposer = proposer
        self.adaptive = adaptive
        self.kv = kv
        self.max_model_len = max_model_len
        self.cost = StepCost()
        self.overall = Acceptance()  # every request's verdicts: the prior of a new one
        self._planned: dict[str, list[int]] = {}  # this step's proposals, by request id
        self._timing: tuple[int, float] | None = None  # the step in flight: tokens, sent at

    def plan(self, running: list[Request], budget: int) -> None:
        """Decides this step's proposals for the running requests, before they are scheduled
        (with every last token known: no step in flight)."""
        self.overall.forget(Acceptance.OVERALL_DECAY)
        prior = self.overall.overall_rate()
        num_tokens = 0
        offered: list[tuple[Request, list[int]]] = []
        candidates: list[tuple[float, int]] = []
        for request in running:
            num_tokens += request.num_tokens_to_compute
            if request.num_tokens_to_compute != 1 or request.sampling.structured is not None:
                continue  # a prefill chunk; or a constraint the proposals would have to pass
            room = min(  # the step's own token counts against each bound
                self.proposer.k,
                request.max_tokens - len(request.output_token_ids) - 1,
                self.max_model_len - request.num_tokens - 1,
            )
            proposal = self.proposer.propose(request.all_token_ids, room) if room > 0 else []
            request.spec_acceptance.forget(Acceptance.REQUEST_DECAY)
            if proposal:
                offered.append((request, proposal))
                candidates.append((request.spec_acceptance.rate(prior), len(proposal)))
        cost = self.cost.seconds if self.adaptive else _free  # free tokens: take all
        taken = choose(candidates, len(running), min(num_tokens, budget), cost)
        self._planned = {
            request.request_id: proposal[:n]
            for (request, proposal), n in zip(offered, taken, strict=True)
            if n
        }

    def propose(self, request: Request, budget: int) -> list[list[int]] | None:
        """Gives a decoding request its planned proposals (request.spec_token_ids, cut to what
        the step's budget leaves) and allocates their slots with them; None (nothing planned,
        or no free blocks for it) leaves it to decode as usual."""
        proposal = self._planned.pop(request.request_id, [])[: budget - 1]
        if not proposal:
            return None
        request.spec_token_ids = proposal
        new_blocks = self.kv.allocate_slots(request, request.num_tokens_to_compute)
        if new_blocks is None:
            request.spec_token_ids = []
        return new_blocks

    def sent(self, step: ScheduledStep, now: float) -> None:
        """A step leaves: timed if it only decodes (prefill chunks cost per token otherwise)
        and computes something (an empty step's near-zero time would price a token at a whole
        step's cost: with steps of 0 and 1 token timed, the line through them)."""
        decoding = (
            step.num_tokens > 0
            and not step.new
            and all(running.num_new == 1 + len(running.draft_token_ids) for running in step.running)
        )
        self._timing = (step.num_tokens, now) if decoding else None

    def done(self, now: float) -> None:
        """The step in flight came back."""
        if self._timing is not None:
            tokens, sent_at = self._timing
            self.cost.record(tokens, now - sent_at)
        self._timing = None

    def settle(self, request: Request, num_drafts: int, num_accepted: int, kept: int) -> None:
        """The worker accepted num_accepted of the step's num_drafts proposals and the scheduler
        kept `kept` of the tokens it returned (fewer after a stop): rolls back the rest."""
        request.spec_token_ids = []
        request.num_computed_tokens -= num_drafts - (kept - 1)
        self.kv.trim(request)
        request.spec_acceptance.add(num_drafts, num_accepted)
        self.overall.add(num_drafts, num_accepted)
        request.num_spec_steps += 1
        request.num_draft_tokens += num_drafts
        request.num_accepted_tokens += num_accepted


class NoSpeculator:
    """Speculative decoding off (no proposer): every request decodes one token per step. The
    Scheduler's speculator then, so that it never asks whether it has one."""

    def plan(self, running: list[Request], budget: int) -> None:
        """Nothing to plan."""

    def propose(self, request: Request, budget: int) -> list[list[int]] | None:
        """None: the request decodes as usual."""
        return None

    def sent(self, step: ScheduledStep, now: float) -> None:
        """No step cost to learn."""

    def done(self, now: float) -> None:
        """No step cost to learn."""

    def settle(self, request: Request, num_drafts: int, num_accepted: int, kept: int) -> None:
        """Never called: no request carries proposals."""


def _free(tokens: int) -> float:
    """The fixed policy's step cost: every token free, so every proposal is taken."""
    return 0.0


def speculator_for(
    proposer: Proposer | None, kv: KVCacheManager, max_model_len: int, adaptive: bool = True
) -> Speculator | NoSpeculator:
    """A Speculator using `proposer`; a NoSpeculator without one (speculative decoding off)."""
    if proposer is None:
        return NoSpeculator()
    return Speculator(proposer, kv, max_model_len, adaptive)


def _rfind_token_aligned(data: bytes, pattern: bytes, end: int) -> int:
    """The last byte offset of `pattern` in data[:end] that starts on a token boundary."""
    while (found := data.rfind(pattern, 0, end)) >= 0 and found % _ITEM:
        end = found + len(pattern) - 1  # the next match starts before this one
    return found
