"""The tokenizer's spans for one request, when this process traces:

- `tokenizer request`, from its arrival to its last output: a child of the gateway's span for
  the choice, and the parent of the scheduler's (its context goes out in Submit.trace);
- `tokenize`: alias resolution, the chat template and encoding, in the thread pool;
- `detokenize`: from the first token ids back to the last (ids to text, stop strings), with
  the time actually spent turning ids into text (`layerserve.detokenize.busy_ms`).
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager

from opentelemetry.trace import Span

from layerserve.common.v1 import common_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common import span_attributes as attrs
from services.common import tracing

_FINISH_NAMES = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}


class RequestTrace:
    """Registered in `live` (request id -> trace) until it ends, so that an abort, which
    reaches no sink, can end it too."""

    __slots__ = ("span", "_request_id", "_live", "_detokenize", "_busy_ns")

    def __init__(self, span: Span, request_id: str, live: dict[str, RequestTrace]) -> None:
        self.span = span
        self._request_id = request_id
        self._live = live
        self._detokenize: Span | None = None
        self._busy_ns = 0
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

    def tokenizing(self) -> AbstractContextManager[Span | None]:
        return tracing.child("tokenize", self.span)

    def tokenized(self, target: str, num_prompt_tokens: int) -> None:
        if self.span.is_recording():
            self.span.set_attribute("gen_ai.response.model", target)  # an alias's pick
            self.span.set_attribute("gen_ai.usage.input_tokens", num_prompt_tokens)

    def carrier(self) -> dict[str, str]:
        return tracing.carrier_of(self.span)

    def detokenizing(self) -> int:
        """Call before turning an output's ids into text; returns the clock for `detokenized`."""
        if self._detokenize is None:
            self._detokenize = tracing.start_span("detokenize", self.span)
        return time.perf_counter_ns()

    def detokenized(self, started_ns: int) -> None:
        self._busy_ns += time.perf_counter_ns() - started_ns

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
