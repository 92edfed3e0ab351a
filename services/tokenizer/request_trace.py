"""The tokenizer's spans, built from its request events (request_events.py) when this process
traces. For one request:

- `tokenizer request`, from its arrival to its last output: a child of the gateway's span for
  the choice, and the parent of the scheduler's (its context goes out in Submit.trace);
- `tokenize`: alias resolution, the chat template and encoding, in the thread pool;
- `detokenize`: from the first token ids back to the last (ids to text, stop strings), with
  the time actually spent turning ids into text (`layerserve.detokenize.busy_ms`);

and an event `migrated` on the request's span each time it moves to another scheduler replica.
"""

from __future__ import annotations

import time

from opentelemetry.trace import Span

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common import span_attributes as attrs
from services.common import tracing
from services.tokenizer.request_events import RequestListener

_FINISH_NAMES = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


class RequestTracer(RequestListener):
    """Listens to the tokenizer's request events and keeps each traced request's spans."""

    __slots__ = ("_live", "_tokenizing")

    def __init__(self) -> None:
        self._live: dict[str, RequestTrace] = {}
        # `tokenize` spans by request id: an aborted request's ends when its tokenizing does.
        self._tokenizing: dict[str, Span] = {}

    def started(self, request: tokenizer_pb2.GenerateRequest) -> None:
        trace = RequestTrace.start(request, self._live)
        span = None if trace is None else tracing.start_span("tokenize", trace.span)
        if span is not None:
            self._tokenizing[request.request_id] = span

    def tokenized(self, request_id: str, target: str, num_prompt_tokens: int) -> None:
        tracing.finish(self._tokenizing.pop(request_id, None))
        trace = self._live.get(request_id)
        if trace is not None:
            trace.tokenized(target, num_prompt_tokens)

    def submitting(self, request_id: str, submit: scheduler_pb2.Submit) -> None:
        trace = self._live.get(request_id)
        if trace is not None:  # else the carrier received goes on (Submit.trace as it came)
            submit.trace.CopyFrom(common_pb2.TraceContext(carrier=trace.carrier()))

    def migrated(self, request_id: str, model: str, reason: str, tokens_done: int) -> None:
        trace = self._live.get(request_id)
        if trace is not None and trace.span.is_recording():
            trace.span.add_event(
                "migrated",
                {
                    "layerserve.migration.reason": reason,
                    "layerserve.migration.tokens_done": tokens_done,
                },
            )

    def detokenizing(self, request_id: str) -> None:
        trace = self._live.get(request_id)
        if trace is not None:
            trace.detokenizing()

    def detokenized(self, request_id: str) -> None:
        trace = self._live.get(request_id)
        if trace is not None:
            trace.detokenized()

    def finished(self, request_id: str, last: tokenizer_pb2.GenerateOutput) -> None:
        trace = self._live.get(request_id)
        if trace is not None:
            trace.finish(last)

    def failed(self, request_id: str, error: BaseException) -> None:
        tracing.finish(self._tokenizing.pop(request_id, None), error)
        trace = self._live.get(request_id)
        if trace is not None:
            trace.finish(None, error)

    def aborted(self, request_id: str) -> None:
        trace = self._live.get(request_id)
        if trace is not None:
            trace.finish(None, aborted=True)


class RequestTrace:
    """One request's spans. Registered in `live` (request id -> trace) until it ends."""

    __slots__ = ("span", "_request_id", "_live", "_detokenize", "_busy_ns", "_clock_ns")

    def __init__(self, span: Span, request_id: str, live: dict[str, RequestTrace]) -> None:
        self.span = span
        self._request_id = request_id
        self._live = live
        self._detokenize: Span | None = None
        self._busy_ns = 0
        self._clock_ns = 0
        live[request_id] = self

    @classmethod
    def start(
        cls, request: tokenizer_pb2.GenerateRequest, live: dict[str, RequestTrace]
    ) -> RequestTrace | None:
        """None when tracing is off."""
        if not tracing.enabled():
            return None
        span = tracing.start_span("tokenizer request", request.trace.carrier)
        if span is None:
            return None
        if span.is_recording():
            span.set_attribute("gen_ai.request.model", request.model)
            span.set_attribute(attrs.CHOICE_ID, request.request_id)
        return cls(span, request.request_id, live)

    def tokenized(self, target: str, num_prompt_tokens: int) -> None:
        if self.span.is_recording():
            self.span.set_attribute("gen_ai.response.model", target)  # an alias's pick
            self.span.set_attribute("gen_ai.usage.input_tokens", num_prompt_tokens)

    def carrier(self) -> dict[str, str]:
        return tracing.carrier_of(self.span)

    def detokenizing(self) -> None:
        """Before an output's ids become text (the first starts the `detokenize` span)."""
        if self._detokenize is None:
            self._detokenize = tracing.start_span("detokenize", self.span)
        self._clock_ns = time.perf_counter_ns()

    def detokenized(self) -> None:
        self._busy_ns += time.perf_counter_ns() - self._clock_ns

    def finish(
        self,
        output: tokenizer_pb2.GenerateOutput | None,
        error: BaseException | None = None,
        *,
        aborted: bool = False,
    ) -> None:
        """Ends every span (once). output: the last one sent to the gateway, if any; aborted:
        the gateway gave up on the request (not an error of ours)."""
        if self._live.pop(self._request_id, None) is None:
            return
        if aborted and self.span.is_recording():
            self.span.set_attribute(attrs.FINISH_REASON, "abort")
        if self._detokenize is not None:
            if self._detokenize.is_recording():
                self._detokenize.set_attribute("layerserve.detokenize.busy_ms", self._busy_ns / 1e6)
            self._detokenize.end()
        if output is not None and self.span.is_recording():
            reason = _FINISH_NAMES.get(output.finish_reason)
            usage = attrs.usage_attributes(output.prompt_tokens, output.completion_tokens, reason)
            self.span.set_attributes(usage)
            self.span.set_attribute(attrs.CACHED_TOKENS, output.cached_tokens)
        tracing.finish(self.span, error)
