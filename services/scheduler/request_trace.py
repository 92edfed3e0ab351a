"""The scheduler's spans for one request, when this process traces. All are children of
`scheduler request` (itself a child of the tokenizer's span, from Submit.trace):

- `admission`: routing, the checks against the model and the worker, queueing;
- `queue`: waiting to start, once per wait (a preempted request waits again);
- `prefill`: one per chunk of prompt (or recomputation) an engine step computes (step_trace.py);
- `decode`: from the first token to the finish, with events `first_token`, `preemption` and
  `finish`.

Attributes: GenAI (model, settings, usage, finish reason) and ours (the choice id, the worker's
address, cached prefix tokens, preemptions).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry.trace import Span

from layerserve.scheduler.v1 import scheduler_pb2
from services.common import span_attributes as attrs
from services.common import tracing
from services.common.sampling import SamplingOptions

if TYPE_CHECKING:
    from services.scheduler.request import Request


class RequestTrace:
    __slots__ = ("span", "_admission", "_queue", "_decode")

    def __init__(self, span: Span) -> None:
        self.span = span
        self._admission: Span | None = tracing.start_span("admission", span)
        self._queue: Span | None = None
        self._decode: Span | None = None

    @classmethod
    def start(cls, submit: scheduler_pb2.Submit) -> RequestTrace | None:
        """At arrival, before admission; None when tracing is off."""
        if not tracing.enabled():
            return None
        span = tracing.start_span("scheduler request", submit.trace.carrier)
        if span is None:
            return None
        if span.is_recording():
            sampling = SamplingOptions.from_proto(submit.sampling)
            span.set_attributes(attrs.request_attributes(submit.model, submit.max_tokens, sampling))
            span.set_attribute(attrs.CHOICE_ID, submit.request_id)
        return cls(span)

    def rejected(self, error: BaseException) -> None:
        """Admission failed: the request never queued."""
        tracing.finish(self._admission, error)
        self._admission = None
        tracing.finish(self.span, error)

    def queued(self, request: Request, worker: str) -> None:
        """Admitted and queued at the worker `worker`, or queued again after a preemption."""
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
            self.span.set_attribute(attrs.PREEMPTIONS, request.num_preemptions)
        tracing.finish(self.span, error)
