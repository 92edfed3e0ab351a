"""What the worker is asked to do in one engine step, and what it answers: the domain form of
worker.v1.StepRequest / StepResult. serving/server.py converts protobuf to and from these."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.errors import LayerserveError
from services.common.sampling import SamplingOptions


@dataclass(slots=True)
class NewSequence:
    """A request the worker has not seen (or one resumed after preemption), in full."""

    request_id: str
    token_ids: list[int]  # prompt, then tokens already generated
    num_prompt_tokens: int
    num_computed_tokens: int  # KV already in the cache (reused prefix); compute starts here
    num_new_tokens: int  # tokens to compute this step
    # Per KV cache group (kv_cache.py), its block table in sequence order; -1 = a block a
    # sliding-window group dropped.
    block_tables: list[list[int]]
    sampling: SamplingOptions = field(default_factory=SamplingOptions)


@dataclass(slots=True)
class RunningSequence:
    """A request the worker holds, as what changed since the previous step."""

    request_id: str
    num_new_tokens: int
    new_block_tables: list[list[int]]  # per KV cache group, the blocks appended to its table
    # Speculative decoding: tokens proposed after the known ones, computed in this step
    # (counted in num_new_tokens) and kept while they are what the sampler picks (spec_verify.py).
    draft_token_ids: list[int] = field(default_factory=list)


@dataclass(slots=True)
class StepPlan:
    new: list[NewSequence] = field(default_factory=list)
    running: list[RunningSequence] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # forget these before the step


@dataclass(slots=True)
class Sampled:
    """One token sampled for a sequence whose computed tokens reached its known tokens."""

    request_id: str
    token_id: int
    logprob: float | None = None  # set when the request asked for logprobs
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)  # most likely first
    # Set when this sequence failed in this step (its output constraint: structured.py); then
    # token_id means nothing and the scheduler ends the request with this error.
    error: LayerserveError | None = None
    # With a sequence's first token: its prompt tokens' logprobs (token, logprob, top), when it
    # asked for them, and its prompt's embedding, when it asked for one. An embedding request
    # samples no token: its one Sampled carries the embedding, and token_id means nothing.
    prompt_logprobs: list[tuple[int, float, list[tuple[int, float]]]] = field(default_factory=list)
    embedding: list[float] | None = None
