"""One engine step as the scheduler sees it: what it sends the worker (ScheduledStep, a diff:
new requests in full, running ones by what changed) and what comes back (StepResult)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.errors import LayerserveError
from services.scheduler.request import Request, Status


@dataclass(frozen=True, slots=True)
class NewRequest:
    """A request the step starts (or resumes after a preemption): sent to the worker in full."""

    request: Request
    num_new: int  # tokens the step computes for it
    # Its tokens before those, whose KV the prefix cache holds (the worker skips them).
    num_cached: int


@dataclass(frozen=True, slots=True)
class RunningRequest:
    """A request the worker already holds: sent as what changed."""

    request: Request
    num_new: int  # tokens the step computes for it (draft_token_ids included)
    # The blocks appended to each of its block tables (one per KV cache group, group 0 first).
    new_blocks: list[list[int]]
    # Speculative decoding: the proposed tokens the step computes after its known tokens.
    draft_token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class ScheduledStep:
    new: list[NewRequest] = field(default_factory=list)
    running: list[RunningRequest] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)  # the worker forgets them

    @property
    def is_empty(self) -> bool:
        return not (self.new or self.running or self.finished_ids)

    @property
    def num_tokens(self) -> int:
        return sum(part.num_new for part in self.requests)

    @property
    def requests(self) -> list[NewRequest | RunningRequest]:
        """Every request the step computes tokens for: new ones first."""
        return [*self.new, *self.running]


@dataclass(frozen=True, slots=True)
class Scheduled:
    """One request of a step sent and not yet answered, as it stood when scheduled."""

    request: Request
    num_computed: int  # its computed tokens once the step has run (KV safe to cache then)
    # request.num_preemptions then: a request preempted since (even if resumed already) is
    # another run of it, and the step's token for it is stale.
    run: int
    samples: bool  # the step reaches its last token (or placeholder): the worker samples one
    num_drafts: int = 0  # proposed tokens it computes after the known ones (counted above)

    @property
    def is_current(self) -> bool:
        """The request still runs as it did when the step was sent (not finished, aborted or
        preempted since)."""
        request = self.request
        return request.status is Status.RUNNING and request.num_preemptions == self.run


@dataclass(slots=True)
class Sample:
    """One token the worker sampled for a request. A step that carried proposals for it
    answers with 1 + a of these, in order: the a proposals it accepted, then its own token."""

    request_id: str
    token_id: int
    logprob: object | None = None  # common.v1.TokenLogprob, passed through untouched
    # The worker could not sample this request (its output constraint failed): it ends with
    # this error, and token_id means nothing.
    error: LayerserveError | None = None
    # With the request's first token: its prompt tokens' logprobs (common.v1.TokenLogprob,
    # untouched) and its prompt's embedding, when it asked for them.
    prompt_logprobs: list[object] = field(default_factory=list)
    embedding: list[float] | None = None


@dataclass(slots=True)
class StepResult:
    """The worker's answer to one step."""

    samples: list[Sample]
    forward_ns: int = 0  # how long the worker's forward pass took
    error: str | None = None  # the worker refused the step, and why (None: it ran)


class StepRejected(Exception):
    """The worker refused a step: its state no longer matches ours, so the link starts over."""


@dataclass(slots=True)
class StepContexts:
    """The trace contexts (W3C carriers) a traced step carries to the worker, for its spans to
    continue: the step's own, and that of each request whose prefill the step advances."""

    step: dict[str, str]
    prefills: dict[str, dict[str, str]]  # request id -> its prefill span's carrier
