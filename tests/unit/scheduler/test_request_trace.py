"""What a request's trace shows of the scheduler's decisions: queue waits, prefill chunks, the
decode with its events, and a preemption (a second wait, a recomputation), driven step by step
as the Engine drives them (the Scheduler's events to a RequestTracer, each step in a StepTrace),
into an in-memory exporter."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.scheduler.block_pool import BlockPool
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.request import Request
from services.scheduler.request_trace import RequestTracer, RequestTraces
from services.scheduler.scheduler import Sample, Scheduler, SchedulerLimits
from services.scheduler.step import StepResult
from services.scheduler.step_trace import StepTracer
from services.scheduler.submission import Submission

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider, "scheduler")
    yield exporter
    tracing.shutdown_tracing()


def _submit(
    scheduler: Scheduler, traces: RequestTraces, rid: str, prompt_len: int, max_tokens: int
) -> Request:
    prompt = list(range(10, 10 + prompt_len))
    traces.start(
        Submission(rid, "m", prompt, MaxTokens(max_tokens), trace_context={"traceparent": PARENT})
    )
    request = Request(rid, prompt, max_tokens, SamplingOptions(), frozenset())
    scheduler.add(request)
    return request


def _step(scheduler: Scheduler, steps: StepTracer) -> None:
    """One engine step, traced; every request that caught up samples token 7."""
    step = scheduler.schedule()
    trace = steps.begin(step, scheduler.stats.num_steps)
    caught_up = [part.request for part in step.requests if part.request.num_output_placeholders]
    samples = [Sample(r.request_id, 7) for r in caught_up]
    trace.end(StepResult(samples))
    scheduler.update(samples)


def test_a_preempted_request_shows_its_second_wait_and_its_recomputation(exporter):
    # Four blocks of four tokens and no prefix cache: two 8-token prompts fill the pool, and
    # the first token that needs a new block preempts the most recent request.
    kv = KVCacheManager(BlockPool(4), 4)
    traces = RequestTraces()
    limits = SchedulerLimits(64, 8, enable_prefix_caching=False)
    tracer = RequestTracer(traces, "worker-0")
    scheduler = Scheduler(limits, kv, 64, frozenset(), observers=[tracer])
    old = _submit(scheduler, traces, "old", prompt_len=8, max_tokens=2)
    _submit(scheduler, traces, "new", prompt_len=8, max_tokens=2)
    steps = StepTracer(traces, "worker-0")
    for _ in range(4):
        _step(scheduler, steps)
    assert not scheduler.requests  # both finished
    assert traces.get("old") is None and traces.get("new") is None  # closed, forgotten

    spans = exporter.get_finished_spans()
    assert {s.context.trace_id for s in spans if s.name != "engine step"} == {int(CLIENT_TRACE, 16)}
    new = next(
        s
        for s in spans
        if s.name == "scheduler request" and s.attributes["layerserve.choice_id"] == "new"
    )
    children = [
        s for s in spans if s.parent is not None and s.parent.span_id == new.context.span_id
    ]
    assert [s.name for s in children].count("queue") == 2  # before its start, after preemption
    prefills = [s for s in children if s.name == "prefill"]
    assert [s.attributes["layerserve.prefill.recompute"] for s in prefills] == [False, True]
    assert prefills[1].attributes["layerserve.prefill.tokens"] == 9  # prompt and its token
    (decode,) = [s for s in children if s.name == "decode"]
    assert [e.name for e in decode.events] == ["first_token", "preemption", "finish"]
    assert new.attributes["layerserve.preemptions"] == 1
    assert new.attributes["gen_ai.usage.output_tokens"] == 2
    assert new.attributes["gen_ai.response.finish_reasons"] == ("length",)
    # Every step links the requests it ran; the first ran both.
    steps = [s for s in spans if s.name == "engine step"]
    old_span = next(s for s in spans if s.name == "scheduler request" and s is not new)
    assert {link.context.span_id for link in steps[0].links} == {
        old_span.context.span_id,
        new.context.span_id,
    }
    assert old.num_preemptions == 0
