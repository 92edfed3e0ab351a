"""The console's trace ring: a request's spans from every service in one trace, engine steps
filed under the requests they ran, each key seeing only its own, and bounded memory."""

from __future__ import annotations

import secrets
import tracemalloc

import pytest

from services.gateway.trace_ring import (
    MAX_ATTRIBUTES,
    RingSpan,
    TraceOwner,
    TraceRing,
    bounded_attributes,
)


def tid() -> str:
    return secrets.token_hex(16)


def span(
    trace_id: str, name: str, parent: str = "", links: tuple[str, ...] = (), **attrs
) -> RingSpan:
    return RingSpan(
        service="layerserve-scheduler",
        name=name,
        trace_id=trace_id,
        span_id=secrets.token_hex(8),
        parent_id=parent,
        start_ns=1,
        end_ns=2,
        attributes=dict(attrs),
        linked_traces=links,
    )


def names(ring: TraceRing, trace_id: str, key: str | None = None) -> list[str]:
    found = ring.trace(trace_id, key)
    assert found is not None
    return sorted(s["name"] for s in found["spans"])


def test_an_engine_step_and_its_children_are_filed_under_every_request_it_ran():
    ring = TraceRing()
    a, b, step = tid(), tid(), tid()
    ring.claim(a, TraceOwner("k", "req-a", "/v1/chat/completions"))
    ring.claim(b, TraceOwner("k", "req-b", "/v1/chat/completions"))
    request = span(a, "scheduler request")
    ring.add([request, span(b, "scheduler request")])
    root = span(step, "engine step", links=(a, b), **{"layerserve.step.sampled": 2})
    early = span(step, "forward", parent=root.span_id)  # the worker exported first
    ring.add([early])
    # A request's prefill links the step that ran it, the other way round: it stays put.
    ring.add([span(a, "prefill", parent=request.span_id, links=(step,))])
    ring.add([root])
    ring.add([span(step, "late child", parent=root.span_id), span(a, "decode", request.span_id)])
    steps = ["engine step", "forward", "late child"]
    assert names(ring, a) == sorted([*steps, "decode", "prefill", "scheduler request"])
    assert names(ring, b) == [*steps, "scheduler request"]
    assert ring.num_spans == 10  # the step's three spans, once per request


def test_a_key_sees_only_its_own_traces_newest_first():
    ring = TraceRing()
    mine, theirs, later = tid(), tid(), tid()
    ring.claim(mine, TraceOwner("key-a", "first", "/v1/completions"))
    ring.claim(theirs, TraceOwner("key-b", "other", "/v1/completions"))
    ring.claim(later, TraceOwner("key-a", "second", "/v1/completions"))
    assert [t["request_id"] for t in ring.recent("key-a")] == ["second", "first"]
    assert ring.trace(theirs, "key-a") is None
    assert ring.trace(theirs, "key-b") is not None
    assert ring.trace(tid(), None) is None  # never claimed


def test_bounds_hold_in_traces_spans_and_spans_per_trace():
    ring = TraceRing(max_traces=10, max_spans=300, max_spans_per_trace=50)
    long_one = tid()
    ring.claim(long_one, TraceOwner("k", "long", "/v1/completions"))
    ring.add([span(long_one, f"decode {i}") for i in range(80)])
    summary = ring.recent("k")[0]
    assert summary["num_spans"] == 50 and summary["dropped_spans"] == 30
    for i in range(100):
        trace_id = tid()
        ring.claim(trace_id, TraceOwner("k", f"r{i}", "/v1/completions"))
        ring.add([span(trace_id, "s") for _ in range(40)])
        assert ring.num_spans <= 300 and len(ring.recent(None, limit=1000)) <= 10
    assert [t["request_id"] for t in ring.recent("k", limit=3)] == ["r99", "r98", "r97"]
    assert ring.trace(long_one, "k") is None  # the oldest went first


def test_spans_of_unknown_traces_never_push_claimed_requests_out():
    ring = TraceRing(max_traces=5, max_spans=1000)
    kept = tid()
    ring.claim(kept, TraceOwner("k", "kept", "/v1/completions"))
    ring.add([span(kept, "scheduler request")])
    for _ in range(200):  # steps whose roots never came, probes of other traces
        ring.add([span(tid(), "forward")])
    assert names(ring, kept, "k") == ["scheduler request"]
    assert ring.num_traces <= 10


def test_memory_stays_bounded_however_many_spans_arrive():
    ring = TraceRing(max_traces=50, max_spans=1_000, max_spans_per_trace=50)
    big = {f"attr.{i}": "x" * 5_000 for i in range(MAX_ATTRIBUTES * 2)}  # what a client sent

    def flood(n: int) -> None:
        for _ in range(n):
            trace_id = tid()
            ring.claim(trace_id, TraceOwner("k", "r", "/v1/completions"))
            spans = [span(trace_id, "decode") for _ in range(50)]
            for s in spans:
                s.attributes = bounded_attributes(big)
            ring.add(spans)

    tracemalloc.start()
    try:
        flood(25)
        full = tracemalloc.get_traced_memory()[0]
        flood(60)
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert ring.num_spans <= 1_000
    assert after < full * 1.25 + 1_000_000
    assert full < 32 * 2**20  # 1,000 spans of at most 48 short values each


def test_a_ring_of_nothing_is_refused():
    with pytest.raises(ValueError):
        TraceRing(max_traces=0)
