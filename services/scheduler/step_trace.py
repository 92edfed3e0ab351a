"""One engine step's spans, when the scheduler traces:

- `engine step`: the root of a trace of its own (a step serves many requests), linked to the
  span of every request it ran; its context goes to the worker in StepRequest.trace, whose
  `forward` span is its child.
- `prefill`: one per request whose prompt (or, after a preemption, whose recomputation) the
  step advances, a child of the request's `scheduler request` span; its context goes to the
  worker with the sequence (NewSequence.trace, RunningSequence.trace), so that the worker's
  span for the chunk joins the request's trace.
"""

from __future__ import annotations

from opentelemetry.trace import Span

from layerserve.worker.v1 import worker_pb2
from services.common import span_attributes as attrs
from services.common import tracing
from services.scheduler.request import Request
from services.scheduler.scheduler import ScheduledStep


def is_prefill(request: Request, num_new: int) -> bool:
    """The step computes prompt (or recomputes known) tokens, not just the last sampled one.
    Called after schedule(), which has already counted num_new as computed."""
    computed_before = request.num_computed_tokens - num_new
    return computed_before < request.num_tokens - 1 or not request.output_token_ids


class StepTrace:
    __slots__ = ("span", "_prefills")

    def __init__(self, span: Span, prefills: dict[str, Span]) -> None:
        self.span = span
        self._prefills = prefills  # request id -> its prefill span in this step

    @classmethod
    def begin(cls, step: ScheduledStep, step_id: int, worker: str) -> StepTrace | None:
        """Call once the step is scheduled, before it is sent; None when tracing is off."""
        if not tracing.enabled():
            return None
        scheduled = [*step.new, *((r, n) for r, n, _ in step.running)]
        traced = [(r, n) for r, n in scheduled if r.trace is not None]
        span = tracing.start_span("engine step", {}, links=[r.trace.span for r, _ in traced])
        assert span is not None
        if span.is_recording():
            span.set_attributes(
                {
                    "layerserve.step.id": step_id,
                    attrs.WORKER: worker,
                    "layerserve.step.new_sequences": len(step.new),
                    "layerserve.step.running_sequences": len(step.running),
                    "layerserve.step.tokens": step.num_tokens,
                }
            )
        for request, num_new in step.new:
            if request.trace is not None:
                request.trace.started(request.num_computed_tokens - num_new)
        prefills = {
            request.request_id: _prefill_span(request, num_new, span)
            for request, num_new in traced
            if is_prefill(request, num_new)
        }
        return cls(span, prefills)

    def annotate(self, msg: worker_pb2.StepRequest) -> None:
        """Gives the step, and each sequence with a prefill chunk in it, the context of its span
        here for the worker's spans to continue; other sequences get none."""
        msg.trace.carrier.update(tracing.carrier_of(self.span))
        for seq in msg.new_sequences:
            span = self._prefills.get(seq.request_id)
            seq.trace.carrier.clear()
            if span is not None:
                seq.trace.carrier.update(tracing.carrier_of(span))
        left = len(self._prefills) - len(msg.new_sequences)  # prefill chunks of running ones
        for seq in msg.running:
            if left <= 0:
                break
            span = self._prefills.get(seq.request_id)
            if span is not None:
                seq.trace.carrier.update(tracing.carrier_of(span))
                left -= 1

    def end(self, result: worker_pb2.StepResult | None, error: str | None = None) -> None:
        """result: the worker's answer (None: the step never came back)."""
        if error is None and result is not None and result.HasField("error"):
            error = "StepRejected"
        if result is not None and self.span.is_recording():
            self.span.set_attribute("layerserve.step.forward_ms", result.forward_ns / 1e6)
            self.span.set_attribute("layerserve.step.sampled", len(result.sampled))
        for span in self._prefills.values():
            tracing.finish(span, error)
        tracing.finish(self.span, error)


def _prefill_span(request: Request, num_new: int, step: Span) -> Span:
    assert request.trace is not None
    span = tracing.start_span("prefill", request.trace.span, links=[step])
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
