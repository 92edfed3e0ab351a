"""The scheduler's spans for one request, when this process traces. All are children of
`scheduler request` (itself a child of the tokenizer's span, from Submit.trace):

- `admission`: routing, the checks against the model and the worker, queueing;
- `queue`: waiting to start, once per wait (a preempted request waits again);
- `prefill`: one per chunk of prompt (or recomputation) an engine step computes (step_trace.py);
- `decode`: from the first token to the finish, with events `first_token`, `preemption`,
  `migrated` (its worker was lost: it moves to another, migration.py) and `finish`.

Attributes: GenAI (model, settings, usage, finish reason) and ours (the choice id, the worker's
address, cached prefix tokens next to those the router predicted, preemptions, and with
speculative decoding the tokens proposed and accepted, the acceptance rate and the mean
accepted length: tokens per step that carried proposals).

The spans live in RequestTraces, by request id, not on the Request: the server starts a trace
at arrival, and each worker's RequestTracer, a SchedulerObserver, moves it along as its
Scheduler decides.
"""

from __future__ import annotations

from opentelemetry.trace import Span

from services.common import span_attributes as attrs
from services.common import tracing
from services.scheduler.request import Request
from services.scheduler.scheduler_events import SchedulerObserver
from services.scheduler.step import ScheduledStep
from services.scheduler.submission import Submission

# The cached prefix tokens the router expected at the worker it chose (next to CACHED_TOKENS,
# those the worker's cache actually served).
PREDICTED_CACHED_TOKENS = "layerserve.predicted_cached_prefix_tokens"
# Speculative decoding: tokens proposed, accepted, their ratio, and the tokens per step that
# carried proposals (accepted + the step's own).
SPEC_DRAFT_TOKENS = "layerserve.spec_decode.draft_tokens"
SPEC_ACCEPTED_TOKENS = "layerserve.spec_decode.accepted_tokens"
SPEC_ACCEPTANCE_RATE = "layerserve.spec_decode.acceptance_rate"
SPEC_MEAN_ACCEPTED_LENGTH = "layerserve.spec_decode.mean_accepted_length"


class RequestTrace:
    __slots__ = ("span", "_admission", "_queue", "_decode")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._admission: Span | None = tracing.start_span("admission", span)
        self._queue: Span | None = None
        self._decode: Span | None = None

    @classmethod
    def start(cls, submission: Submission) -> RequestTrace | None:
        """At arrival, before admission; None when tracing is off."""
        if not tracing.enabled():
            return None
        span = tracing.start_span("scheduler request", submission.trace_context)
        if span is None:
            return None
        if span.is_recording():
            span.set_attributes(
                attrs.request_attributes(
                    submission.model, submission.max_tokens.limit, submission.sampling
                )
            )
            span.set_attribute(attrs.CHOICE_ID, submission.request_id)
        return cls(span)

    def rejected(self, error: BaseException) -> None:
        """Admission failed: the request never queued."""
        tracing.finish(self._admission, error)
        self._admission = None
        tracing.finish(self.span, error)

    def queued(self, request: Request, worker: str) -> None:
        """Admitted and queued at the worker `worker`."""
        if self._admission is not None:
            if self.span.is_recording():
                self.span.set_attribute(attrs.WORKER, worker)
                self.span.set_attribute("gen_ai.request.max_tokens", request.max_tokens)
                self.span.set_attribute("gen_ai.usage.input_tokens", request.num_prompt_tokens)
            self._admission.end()
            self._admission = None
        self._queue = tracing.start_span("queue", self.span)

    def started(self, num_cached: int) -> None:
        """Left the queue: this step computes its first tokens, after `num_cached` tokens whose
        KV the prefix cache held."""
        if self._queue is None:
            return
        if self._queue.is_recording():
            self._queue.set_attribute(attrs.CACHED_TOKENS, num_cached)
        self._queue.end()
        self._queue = None

    def preempted(self) -> None:
        """Its blocks went to others; it waits to be recomputed."""
        (self._decode or self.span).add_event("preemption")
        self._queue = tracing.start_span("queue", self.span)

    def migrating(self, reason: str, worker: str, num_output_tokens: int) -> None:
        """Its worker was lost: it moves to another (queued there next), its output kept."""
        tracing.finish(self._queue, None)
        self._queue = None
        (self._decode or self.span).add_event(
            "migrated",
            {
                "layerserve.migration.reason": reason,
                attrs.WORKER: worker,
                "gen_ai.usage.output_tokens": num_output_tokens,
            },
        )

    def sampled(self) -> None:
        """A token came back from the worker."""
        if self._decode is None:
            self._decode = tracing.start_span("decode", self.span)
            self._decode.add_event("first_token")

    def finish(self, request: Request, error: str | None = None) -> None:
        """Ended: finished, aborted, expired (error) or failed with its worker (error)."""
        tracing.finish(self._queue, error)
        self._queue = None
        reason = request.finish_reason.value if request.finish_reason is not None else None
        if self._decode is not None:
            self._decode.add_event("finish", {attrs.FINISH_REASON: reason or "error"})
            if self._decode.is_recording():
                outputs = len(request.output_token_ids)
                self._decode.set_attribute("gen_ai.usage.output_tokens", outputs)
            self._decode.end()
            self._decode = None
        if self.span.is_recording():
            self.span.set_attributes(
                attrs.usage_attributes(
                    request.num_prompt_tokens, len(request.output_token_ids), reason
                )
            )
            self.span.set_attribute(attrs.CACHED_TOKENS, request.num_cached_tokens)
            if request.predicted_cached_tokens is not None:
                self.span.set_attribute(PREDICTED_CACHED_TOKENS, request.predicted_cached_tokens)
            self.span.set_attribute(attrs.PREEMPTIONS, request.num_preemptions)
            if request.num_spec_steps:
                self.span.set_attributes(spec_decode_attributes(request))
        tracing.finish(self.span, error)


def spec_decode_attributes(request: Request) -> dict[str, object]:
    """Speculative decoding's record for a request that speculated at least once."""
    drafts, accepted, steps = (
        request.num_draft_tokens,
        request.num_accepted_tokens,
        request.num_spec_steps,
    )
    return {
        SPEC_DRAFT_TOKENS: drafts,
        SPEC_ACCEPTED_TOKENS: accepted,
        SPEC_ACCEPTANCE_RATE: accepted / drafts if drafts else 0.0,
        SPEC_MEAN_ACCEPTED_LENGTH: (accepted + steps) / steps,
    }


class RequestTraces:
    """The open traces of this process's requests, by request id (one book for all workers)."""

    def __init__(self) -> None:
        self._open: dict[str, RequestTrace] = {}

    def start(self, submission: Submission) -> None:
        """At arrival, before routing (nothing when tracing is off)."""
        trace = RequestTrace.start(submission)
        if trace is not None:
            self._open[submission.request_id] = trace

    def rejected(self, request_id: str, error: BaseException) -> None:
        """Routing or admission failed: the request never queued."""
        trace = self._open.pop(request_id, None)
        if trace is not None:
            trace.rejected(error)

    def get(self, request_id: str) -> RequestTrace | None:
        return self._open.get(request_id)

    def pop(self, request_id: str) -> RequestTrace | None:
        return self._open.pop(request_id, None)


class RequestTracer(SchedulerObserver):
    """Moves each request's trace along as the Scheduler of the worker `worker` decides."""

    def __init__(self, traces: RequestTraces, worker: str) -> None:
        self.traces = traces
        self.worker = worker

    def admitted(self, request: Request) -> None:
        trace = self.traces.get(request.request_id)
        if trace is not None:
            trace.queued(request, self.worker)

    def scheduled(self, step: ScheduledStep, now: float) -> None:
        for new in step.new:
            trace = self.traces.get(new.request.request_id)
            if trace is not None:
                trace.started(new.num_cached)

    def preempted(self, request: Request) -> None:
        trace = self.traces.get(request.request_id)
        if trace is not None:
            trace.preempted()

    def first_token(self, request: Request) -> None:
        trace = self.traces.get(request.request_id)
        if trace is not None:
            trace.sampled()

    def finished(self, request: Request) -> None:
        trace = self.traces.pop(request.request_id)
        if trace is not None:
            error = request.error.rpc_code if request.error is not None else None
            trace.finish(request, error)
