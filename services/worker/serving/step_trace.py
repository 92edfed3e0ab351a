"""The worker's spans for one step, when this process traces and the scheduler sent contexts:

- `forward`: the step on the model thread (a wait behind the previous step included), a child
  of the scheduler's `engine step` (StepRequest.trace);
- `worker prefill`: one per prefill chunk in the step, a child of the scheduler's `prefill`
  span for it (NewSequence.trace, RunningSequence.trace), so that the request's own trace
  holds the worker's part; linked to `forward`, which it lasts as long as.
"""

from __future__ import annotations

from opentelemetry.trace import Span

from layerserve.worker.v1 import worker_pb2
from services.common import span_attributes as attrs
from services.common import tracing


class StepTrace:
    __slots__ = ("_forward", "_sequences")

    def __init__(self, forward: Span | None, sequences: list[Span]) -> None:
        self._forward = forward
        self._sequences = sequences

    @classmethod
    def begin(cls, msg: worker_pb2.StepRequest) -> StepTrace | None:
        """None when tracing is off here or the scheduler sent no context."""
        if not tracing.enabled():
            return None
        forward = None
        if msg.trace.carrier:
            forward = tracing.start_span("forward", msg.trace.carrier)
            _describe_step(forward, msg)
        sequences = [
            _sequence_span(seq, forward)
            for seq in (*msg.new_sequences, *msg.running)
            if seq.trace.carrier
        ]
        if forward is None and not sequences:
            return None
        return cls(forward, sequences)

    def end(self, result: worker_pb2.StepResult | None, error: BaseException | None = None) -> None:
        """result: what goes back to the scheduler (None: the step raised `error`)."""
        failure: BaseException | str | None = error
        if result is not None and result.HasField("error"):
            failure = "StepRejected"
        forward = self._forward
        if forward is not None and result is not None and forward.is_recording():
            forward.set_attribute("layerserve.step.forward_ms", result.forward_ns / 1e6)
            forward.set_attribute("layerserve.step.sampled", len(result.sampled))
        for span in self._sequences:
            tracing.finish(span, failure)
        tracing.finish(forward, failure)


def _describe_step(span: Span | None, msg: worker_pb2.StepRequest) -> None:
    if not tracing.recording(span):
        return
    tokens = sum(s.num_new_tokens for s in msg.new_sequences)
    tokens += sum(s.num_new_tokens for s in msg.running)
    span.set_attributes(
        {
            "layerserve.step.id": msg.step_id,
            "layerserve.step.new_sequences": len(msg.new_sequences),
            "layerserve.step.running_sequences": len(msg.running),
            "layerserve.step.tokens": tokens,
        }
    )


def _sequence_span(
    seq: worker_pb2.NewSequence | worker_pb2.RunningSequence, forward: Span | None
) -> Span:
    span = tracing.start_span(
        "worker prefill", seq.trace.carrier, links=[forward] if forward is not None else ()
    )
    assert span is not None
    if span.is_recording():
        span.set_attribute(attrs.CHOICE_ID, seq.request_id)
        span.set_attribute("layerserve.prefill.tokens", seq.num_new_tokens)
        if isinstance(seq, worker_pb2.NewSequence):  # its first chunk: after the cached prefix
            span.set_attribute(attrs.CACHED_TOKENS, seq.num_computed_tokens)
    return span
