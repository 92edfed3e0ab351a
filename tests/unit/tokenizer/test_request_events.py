"""The tokenizer's request events and the spans built from them (RequestTracer), into an
in-memory exporter: the session code only emits; tracing keeps its own state."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common import tracing
from services.common.errors import InvalidArgument, Unavailable
from services.common.mux import Outbox
from services.tokenizer.output_sink import OutputSink
from services.tokenizer.request_events import RequestEvents, RequestListener
from services.tokenizer.request_trace import RequestTracer
from services.tokenizer.text_model import TextModel
from services.tokenizer.text_stream import TextStream

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"
STOP = common_pb2.FINISH_REASON_STOP


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider, "tokenizer")
    yield exporter
    tracing.shutdown_tracing()


def _request(rid: str = "r-1") -> tokenizer_pb2.GenerateRequest:
    request = tokenizer_pb2.GenerateRequest(request_id=rid, model="alias")
    request.trace.carrier["traceparent"] = PARENT
    return request


def _spans(exporter: InMemorySpanExporter) -> dict:
    return {span.name: span for span in exporter.get_finished_spans()}


class Recorder(RequestListener):
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def detokenizing(self, request_id: str) -> None:
        self.events.append(("detokenizing", request_id))

    def detokenized(self, request_id: str) -> None:
        self.events.append(("detokenized", request_id))

    def finished(self, request_id: str, last: tokenizer_pb2.GenerateOutput) -> None:
        self.events.append(("finished", request_id, last.finish_reason))

    def failed(self, request_id: str, error: BaseException) -> None:
        self.events.append(("failed", request_id, type(error).__name__))


def test_a_request_traced_from_its_events(exporter):
    tracer = RequestTracer()
    tracer.started(_request())
    tracer.tokenized("r-1", "target-model", 5)
    submit = scheduler_pb2.Submit(request_id="r-1", trace=_request().trace)
    tracer.submitting("r-1", submit)
    for _ in range(2):
        tracer.detokenizing("r-1")
        tracer.detokenized("r-1")
    last = tokenizer_pb2.GenerateOutput(
        finish_reason=STOP, prompt_tokens=5, completion_tokens=3, cached_tokens=4
    )
    tracer.finished("r-1", last)
    spans = _spans(exporter)
    assert set(spans) == {"tokenizer request", "tokenize", "detokenize"}
    request = spans["tokenizer request"]
    assert format(request.context.trace_id, "032x") == CLIENT_TRACE  # the gateway's trace
    assert spans["tokenize"].parent.span_id == request.context.span_id
    assert spans["detokenize"].parent.span_id == request.context.span_id
    assert request.attributes["gen_ai.request.model"] == "alias"
    assert request.attributes["gen_ai.response.model"] == "target-model"
    assert request.attributes["gen_ai.usage.input_tokens"] == 5
    assert request.attributes["layerserve.cached_prefix_tokens"] == 4
    assert request.attributes["layerserve.finish_reason"] == "stop"
    assert spans["detokenize"].attributes["layerserve.detokenize.busy_ms"] >= 0
    # The scheduler's span becomes a child of this request's, not of the gateway's.
    assert format(request.context.span_id, "016x") in submit.trace.carrier["traceparent"]


def test_a_prompt_that_fails_to_tokenize_fails_both_spans(exporter):
    tracer = RequestTracer()
    tracer.started(_request())
    tracer.failed("r-1", InvalidArgument("too long"))
    spans = _spans(exporter)
    assert set(spans) == {"tokenizer request", "tokenize"}
    for span in spans.values():
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "InvalidArgument"


def test_an_abort_while_tokenizing_ends_the_request_then_its_tokenize_span(exporter):
    tracer = RequestTracer()
    tracer.started(_request())
    tracer.aborted("r-1")
    assert [s.name for s in exporter.get_finished_spans()] == ["tokenizer request"]
    tracer.tokenized("r-1", "target-model", 5)
    spans = _spans(exporter)
    assert spans["tokenizer request"].attributes["layerserve.finish_reason"] == "abort"
    assert "gen_ai.response.model" not in spans["tokenizer request"].attributes
    assert spans["tokenize"].status.status_code is StatusCode.UNSET
    tracer.aborted("r-1")  # an abort after the end: nothing left to end
    tracer.finished("r-1", tokenizer_pb2.GenerateOutput())
    assert len(exporter.get_finished_spans()) == 2


def test_untraced_the_received_context_goes_on_unchanged():
    tracer = RequestTracer()
    tracer.started(_request())  # tracing is off: nothing is kept
    submit = scheduler_pb2.Submit(request_id="r-1", trace=_request().trace)
    tracer.submitting("r-1", submit)
    assert dict(submit.trace.carrier) == {"traceparent": PARENT}


def test_every_listener_hears_every_event_in_order():
    first, second = Recorder(), Recorder()
    events = RequestEvents([first, second])
    events.detokenizing("r")
    events.failed("r", Unavailable("gone"))
    assert first.events == second.events == [("detokenizing", "r"), ("failed", "r", "Unavailable")]


class _Mux:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


def _sink(model: TextModel, recorder: Recorder, stop: list[str]) -> tuple[OutputSink, Outbox]:
    outbox: Outbox = Outbox()
    stream = TextStream.create(model, model.encode("Say hi"), stop, True)
    sink = OutputSink("r", "m", stream, outbox, {"r"}, _Mux(), recorder)  # type: ignore[arg-type]
    return sink, outbox


def test_the_sink_tells_each_output_and_the_end(smollm: TextModel):
    recorder = Recorder()
    sink, _ = _sink(smollm, recorder, stop=["world"])
    ids = smollm.encode("Hello world and more")
    sink(scheduler_pb2.RequestOutput(request_id="r", token_ids=ids[:1]))
    sink(scheduler_pb2.RequestOutput(request_id="r", token_ids=ids[1:]))  # meets the stop string
    sink(scheduler_pb2.RequestOutput(request_id="r", token_ids=ids[:1]))  # after the end: ignored
    assert recorder.events == [
        ("detokenizing", "r"),
        ("detokenized", "r"),
        ("detokenizing", "r"),
        ("detokenized", "r"),
        ("finished", "r", STOP),
    ]


def test_the_sink_tells_a_broken_scheduler_stream(smollm: TextModel):
    recorder = Recorder()
    sink, _ = _sink(smollm, recorder, stop=[])
    sink(Unavailable("the scheduler stream broke"))
    assert recorder.events == [("failed", "r", "Unavailable")]
