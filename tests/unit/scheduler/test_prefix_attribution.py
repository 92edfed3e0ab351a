"""Whether routing guessed the cached prefix right: each request records the cached tokens the
router expected at the worker it chose next to those the worker's cache served, on its
`scheduler request` span and, as their difference, in a histogram an operator can watch."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY, generate_latest

from services.common import tracing
from services.scheduler.request_trace import RequestTraces
from services.scheduler.routing import RoutingMode
from services.scheduler.submission import Submission
from tests.prometheus_text import Scrape
from tests.unit.scheduler.replicas import MODEL, drain, routed_cluster, serve, submit

SYSTEM = list(range(100, 356))  # 256 tokens: 64 blocks of 4
ERROR = "layerserve:prefix_cache_prediction_error_tokens"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider, "scheduler")
    yield exporter
    tracing.shutdown_tracing()


def scrape() -> Scrape:
    return Scrape.parse(generate_latest(REGISTRY).decode())


def request_spans(exporter: InMemorySpanExporter) -> dict[str, dict]:
    return {
        s.attributes["layerserve.choice_id"]: dict(s.attributes)
        for s in exporter.get_finished_spans()
        if s.name == "scheduler request"
    }


def test_a_cached_prefix_the_router_counted_on_is_reused_an_error_of_zero(exporter):
    traces = RequestTraces()
    router, _ = routed_cluster(["a:1", "b:1"], traces=traces)
    a, b = router.engines
    serve(b, "warm", SYSTEM + [1])
    before = scrape()
    traces.start(Submission("hit", MODEL, SYSTEM + [2, 3]))
    assert submit(router, "hit", SYSTEM + [2, 3]) is b
    drain(b)
    span = request_spans(exporter)["hit"]
    assert span["layerserve.predicted_cached_prefix_tokens"] == 256
    assert span["layerserve.cached_prefix_tokens"] == 256
    after = scrape()
    assert after.delta(before, ERROR + "_count", model=MODEL) == 1
    assert after.delta(before, ERROR + "_bucket", model=MODEL, le="-1.0") == 0
    assert after.delta(before, ERROR + "_bucket", model=MODEL, le="0.0") == 1  # exactly 0


def test_a_prefix_routed_moments_ago_but_not_computed_yet_shows_as_an_overestimate(exporter):
    # The router remembers where it just sent a prefix (recent_routes.py) and sends the next
    # request with it there too, expecting it cached; but both start in the same step, before
    # the first has computed it, so the second reuses nothing.
    traces = RequestTraces()
    router, _ = routed_cluster(["a:1"], traces=traces)
    (a,) = router.engines
    before = scrape()
    for rid, last in (("first", 1), ("second", 2)):
        traces.start(Submission(rid, MODEL, SYSTEM + [last]))
        submit(router, rid, SYSTEM + [last])
    drain(a)
    spans = request_spans(exporter)
    assert spans["first"]["layerserve.predicted_cached_prefix_tokens"] == 0
    assert spans["second"]["layerserve.predicted_cached_prefix_tokens"] == 256
    assert spans["second"]["layerserve.cached_prefix_tokens"] == 0
    after = scrape()
    assert after.delta(before, ERROR + "_count", model=MODEL) == 2
    assert after.delta(before, ERROR + "_bucket", model=MODEL, le="-1.0") == 0
    assert after.delta(before, ERROR + "_bucket", model=MODEL, le="0.0") == 1  # the first
    assert after.delta(before, ERROR + "_bucket", model=MODEL, le="64.0") == 1
    assert after.delta(before, ERROR + "_bucket", model=MODEL, le="256.0") == 2  # +256


def test_routing_modes_that_ignore_caches_predict_nothing(exporter):
    traces = RequestTraces()
    router, _ = routed_cluster(["a:1"], mode=RoutingMode.LOAD, traces=traces)
    (a,) = router.engines
    before = scrape()
    traces.start(Submission("r", MODEL, SYSTEM))
    submit(router, "r", SYSTEM)
    drain(a)
    assert "layerserve.predicted_cached_prefix_tokens" not in request_spans(exporter)["r"]
    assert scrape().delta(before, ERROR + "_count", model=MODEL) == 0
