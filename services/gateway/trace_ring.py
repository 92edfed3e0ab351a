"""The stack's recent traces, kept by the gateway in memory for the console (console_routes.py).

Spans arrive from every service (trace_receiver.py) in no particular order: each process
exports on its own schedule. A request's trace is one bucket; an engine step is a trace of its
own whose root links the requests it ran, so a step (and its children, e.g. the worker's
`forward`) is filed under every request it links. A span with a parent that links a step (a
request's `prefill` links the step that ran it) stays in its own trace. A step's child that
arrives before the step's root waits in a bucket of its own until the root names its requests.

Bounded three ways, whatever the traffic: at most `max_traces` buckets and `max_spans` spans
in all (the oldest bucket goes first), at most `max_spans_per_trace` in one bucket (a long
generation keeps its first steps and counts the rest as dropped), and every span's attributes
cut to a fixed number of short values. Who may see a trace is decided by `claim`: the gateway
files each request's trace under the key that sent it. Thread-safe: the receiver adds from its
own threads while the event loop claims and reads.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

MAX_ATTRIBUTES = 48
MAX_VALUE_CHARS = 200


@dataclass(slots=True)
class RingSpan:
    service: str  # service.name of the process that made it
    name: str
    trace_id: str  # 32 hex digits
    span_id: str  # 16 hex digits
    parent_id: str  # "" for a root
    start_ns: int  # Unix epoch nanoseconds, on the exporting process's clock
    end_ns: int
    attributes: dict[str, object] = field(default_factory=dict)
    linked_traces: tuple[str, ...] = ()  # the traces this span served (an engine step's)
    error: str = ""  # the status description of a failed span

    def as_json(self) -> dict:
        return {
            "service": self.service,
            "name": self.name,
            "span_id": self.span_id,
            "parent_id": self.parent_id,
            "trace_id": self.trace_id,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "attributes": self.attributes,
            "error": self.error,
        }


def bounded_attributes(attributes: dict[str, object]) -> dict[str, object]:
    """At most MAX_ATTRIBUTES values, strings and sequences cut to MAX_VALUE_CHARS."""
    kept: dict[str, object] = {}
    for key, value in list(attributes.items())[:MAX_ATTRIBUTES]:
        if isinstance(value, str | bytes):
            value = str(value)[:MAX_VALUE_CHARS]
        elif isinstance(value, tuple | list):
            value = str(list(value))[:MAX_VALUE_CHARS]
        kept[str(key)[:MAX_VALUE_CHARS]] = value
    return kept


@dataclass(slots=True)
class _Bucket:
    spans: list[RingSpan] = field(default_factory=list)
    dropped: int = 0


@dataclass(slots=True)
class TraceOwner:
    """Who sent a request, and what the console may say about it."""

    key: str  # the API key's tenant id
    request_id: str
    path: str
    prompt: str = ""  # only when the operator logs prompts (LAYERSERVE_LOG_PROMPTS=1)
    started: float = field(default_factory=time.time)  # Unix seconds
    done: bool = False  # the gateway has answered it


class TraceRing:
    def __init__(
        self, max_traces: int = 200, max_spans: int = 50_000, max_spans_per_trace: int = 2_000
    ) -> None:
        if min(max_traces, max_spans, max_spans_per_trace) < 1:
            raise ValueError("a trace ring holds at least one trace and one span")
        self.max_traces = max_traces
        self.max_spans = max_spans
        self.max_spans_per_trace = max_spans_per_trace
        # Claimed traces (a request the gateway saw), oldest first, and their owners.
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()
        self._owners: dict[str, TraceOwner] = {}
        # Spans of traces not (yet) known: a step's children before its root, a request
        # before its claim. Bounded apart, so that a flood of steps never pushes requests out.
        self._pending: OrderedDict[str, _Bucket] = OrderedDict()
        self._step_requests: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        self._num_spans = 0
        self._lock = threading.Lock()

    @property
    def num_spans(self) -> int:
        return self._num_spans

    @property
    def num_traces(self) -> int:
        return len(self._buckets) + len(self._pending)

    def claim(self, trace_id: str, owner: TraceOwner) -> None:
        """Files the trace `trace_id` under `owner` (the gateway, as a request comes in)."""
        with self._lock:
            self._owners[trace_id] = owner
            self._buckets[trace_id] = self._pending.pop(trace_id, None) or _Bucket()
            self._evict()

    def add(self, spans: list[RingSpan]) -> None:
        with self._lock:
            for span in spans:
                if span.linked_traces and not span.parent_id:
                    self._add_step_root(span)
                else:
                    for trace_id in self._step_requests.get(span.trace_id, (span.trace_id,)):
                        self._file(trace_id, span)
            self._evict()

    def recent(self, key: str | None, limit: int = 50) -> list[dict]:
        """The newest claimed traces first, only `key`'s (None: everyone's)."""
        found = []
        with self._lock:
            for trace_id in reversed(self._buckets):
                owner = self._owners[trace_id]
                if key is None or owner.key == key:
                    found.append(self._summary(trace_id, owner))
                if len(found) >= limit:
                    break
        return found

    def in_flight(self, key: str | None) -> list[dict]:
        """The key's requests not answered yet (None: everyone's), oldest first."""
        now = time.time()
        with self._lock:
            owners = [(t, o) for t, o in self._owners.items() if not o.done]
        return [
            {"trace_id": t, "request_id": o.request_id, "path": o.path, "age_s": now - o.started}
            for t, o in owners
            if key is None or o.key == key
        ]

    def trace(self, trace_id: str, key: str | None) -> dict | None:
        """One trace, its spans oldest first; None when unknown, evicted or not `key`'s."""
        with self._lock:
            owner = self._owners.get(trace_id)
            if owner is None or (key is not None and owner.key != key):
                return None
            spans = sorted(self._buckets[trace_id].spans, key=lambda s: (s.start_ns, s.end_ns))
            return {**self._summary(trace_id, owner), "spans": [s.as_json() for s in spans]}

    def _summary(self, trace_id: str, owner: TraceOwner) -> dict:
        bucket = self._buckets[trace_id]
        starts = [s.start_ns for s in bucket.spans]
        ends = [s.end_ns for s in bucket.spans]
        return {
            "trace_id": trace_id,
            "request_id": owner.request_id,
            "path": owner.path,
            "prompt": owner.prompt,
            "start_ns": min(starts, default=0),
            "duration_ms": (max(ends) - min(starts)) / 1e6 if starts else 0.0,
            "num_spans": len(bucket.spans),
            "dropped_spans": bucket.dropped,
            "services": sorted({s.service for s in bucket.spans}),
        }

    def _add_step_root(self, span: RingSpan) -> None:
        """An engine step's root: file it, and its children that came first, under each
        request it ran."""
        requests = tuple(t for t in span.linked_traces if t != span.trace_id)
        self._step_requests[span.trace_id] = requests
        while len(self._step_requests) > 4 * self.max_traces:
            self._step_requests.popitem(last=False)
        early = self._pending.pop(span.trace_id, _Bucket())
        self._num_spans -= len(early.spans)
        for trace_id in requests:
            for each in (span, *early.spans):
                self._file(trace_id, each)

    def _file(self, trace_id: str, span: RingSpan) -> None:
        bucket = self._buckets.get(trace_id)
        if bucket is None:
            bucket = self._pending.setdefault(trace_id, _Bucket())
        if len(bucket.spans) >= self.max_spans_per_trace:
            bucket.dropped += 1
            return
        bucket.spans.append(span)
        self._num_spans += 1

    def _evict(self) -> None:
        while len(self._pending) > self.max_traces:
            self._drop(self._pending)
        while len(self._buckets) > self.max_traces:
            self._drop(self._buckets)
        while self._num_spans > self.max_spans:
            self._drop(self._pending if self._pending else self._buckets)

    def _drop(self, buckets: OrderedDict[str, _Bucket]) -> None:
        trace_id, bucket = buckets.popitem(last=False)  # the oldest
        self._num_spans -= len(bucket.spans)
        self._owners.pop(trace_id, None)
