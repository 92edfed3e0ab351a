"""One engine step's spans, when the scheduler traces:

- `engine step`: the root of a trace of its own (a step serves many requests), linked to the
  span of every request it ran; its context goes to the worker in StepRequest.trace, whose
  `forward` span is its child.
- `prefill`: one per request whose prompt (or, after a preemption, whose recomputation) the
  step advances, a child of the request's `scheduler request` span; its context goes to the
  worker with the sequence (NewSequence.trace, RunningSequence.trace), so that the worker's
  span for the chunk joins the request's trace.

The engine brackets each step it sends with begin() and end(); when the process does not
trace, begin() hands out UNTRACED, which does nothing.
"""

from __future__ import annotations

from opentelemetry.trace import Span

from services.common import span_attributes as attrs
from services.common import tracing
from services.scheduler.request import Request
from services.scheduler.request_trace import RequestTraces
from services.scheduler.step import ScheduledStep, StepContexts, StepResult


def is_prefill(request: Request, num_new: int) -> bool:
    """The step computes prompt (or recomputes known) tokens, not just the last sampled one (or
    its placeholder). Called after schedule(), which has already counted num_new as computed
    and, for a request the step samples, its placeholder."""
    computed_before = request.num_computed_tokens - num_new
    samples = (
        request.num_computed_tokens == request.num_tokens + request.num_output_placeholders - 1
    )
    return not (num_new == 1 and samples and computed_before >= request.num_prompt_tokens)


class StepTrace:
    __slots__ = ("span", "_prefills")

    def __init__(self, span: Span | None, prefills: dict[str, Span]) -> None:
        self.span = span  # None: not traced
        self._prefills = prefills  # request id -> its prefill span in this step

    @property
    def contexts(self) -> StepContexts | None:
        """What the worker's spans continue (None: not traced, requests carry their callers')."""
        if self.span is None:
            return None
        prefills = {rid: tracing.carrier_of(span) for rid, span in self._prefills.items()}
        return StepContexts(tracing.carrier_of(self.span), prefills)

    def end(self, result: StepResult | None, error: str | None = None) -> None:
        """result: the worker's answer (None: the step never came back)."""
        if self.span is None:
            return
        if error is None and result is not None and result.error is not None:
            error = "StepRejected"
        if result is not None and self.span.is_recording():
            self.span.set_attribute("layerserve.step.forward_ms", result.forward_ns / 1e6)
            self.span.set_attribute("layerserve.step.sampled", len(result.samples))
        for span in self._prefills.values():
            tracing.finish(span, error)
        tracing.finish(self.span, error)


UNTRACED = StepTrace(None, {})


class StepTracer:
    """Starts the spans of each step sent to the worker `worker`; the requests' own spans are
    in `traces`."""

    def __init__(self, traces: RequestTraces, worker: str) -> None:
        self.traces = traces
        self.worker = worker

    def begin(self, step: ScheduledStep, step_id: int) -> StepTrace:
        """Call once the step is scheduled, before it is sent."""
        if not tracing.enabled():
            return UNTRACED
        traced = [
            (part.request, part.num_new, trace.span)
            for part in step.requests
            if (trace := self.traces.get(part.request.request_id)) is not None
        ]
        span = tracing.start_span("engine step", {}, links=[s for _, _, s in traced])
        assert span is not None
        if span.is_recording():
            span.set_attributes(
                {
                    "layerserve.step.id": step_id,
                    attrs.WORKER: self.worker,
                    "layerserve.step.new_sequences": len(step.new),
                    "layerserve.step.running_sequences": len(step.running),
                    "layerserve.step.tokens": step.num_tokens,
                }
            )
        prefills = {
            request.request_id: _prefill_span(request, num_new, parent, span)
            for request, num_new, parent in traced
            if is_prefill(request, num_new)
        }
        return StepTrace(span, prefills)


def _prefill_span(request: Request, num_new: int, parent: Span, step: Span) -> Span:
    span = tracing.start_span("prefill", parent, links=[step])
    assert span is not None
    if span.is_recording():
        span.set_attributes(
            {
                "layerserve.prefill.tokens": num_new,
                "layerserve.prefill.start": request.num_computed_tokens - num_new,
                "layerserve.prefill.recompute": bool(request.output_token_ids),
            }
        )
    return span
