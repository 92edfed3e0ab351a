"""One engine step as the scheduler sees it: what it sends the worker (ScheduledStep, a diff:
new requests in full, running ones by what changed) and what comes back (StepResult)."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.common.errors import LayerserveError
from services.scheduler.request import Request, Status


@dataclass(slots=True)
class ScheduledStep:
    new: list[tuple[Request, int]] = field(default_factory=list)  # sent in full
    # As diffs: the request, its tokens to compute, and the blocks appended to each of its
    # block tables (one list per KV cache group, group 0 first).
    running: list[tuple[Request, int, list[list[int]]]] = field(default_factory=list)
    finished_ids: list[str] = field(default_factory=list)
    # Speculative decoding: by request id, the proposed tokens the step computes after that
    # running request's known tokens (counted in its tokens to compute).
    drafts: dict[str, list[int]] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return not (self.new or self.running or self.finished_ids)

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.new) + sum(n for _, n, _ in self.running)

    @property
    def requests(self) -> list[tuple[Request, int]]:
        """Every request the step computes tokens for, with how many: new ones first."""
        return [*self.new, *((r, n) for r, n, _ in self.running)]


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
