"""A real OTLP/gRPC trace receiver for tests: what an OpenTelemetry collector (or Jaeger) would
get from the services, kept in memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str  # hex, as in a traceparent
    span_id: str
    parent_id: str  # "" for a root
    attributes: dict[str, object]
    links: tuple[tuple[str, str], ...]  # (trace id, span id)
    events: tuple[str, ...] = field(default=())
    start_ns: int = 0  # Unix epoch nanoseconds, each process's own clock
    end_ns: int = 0


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []

    @property
    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def Export(self, request, context) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                received.extend(
                    _span(str(resource.get("service.name", "")), s) for s in scope_spans.spans
                )
        with self._lock:
            self._spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(
        self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 20.0
    ) -> list[ReceivedSpan]:
        """The spans received, once done(spans) holds (or the timeout passed)."""
        deadline = time.monotonic() + timeout
        while not done(spans := self.spans) and time.monotonic() < deadline:
            time.sleep(0.1)
        return spans


@contextmanager
def running_collector(port: int) -> Iterator[Collector]:
    collector = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield collector
    finally:
        server.stop(grace=None)


def _span(service: str, span) -> ReceivedSpan:
    return ReceivedSpan(
        service=service,
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        attributes=_attributes(span.attributes),
        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
        events=tuple(event.name for event in span.events),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
    )


def _attributes(key_values) -> dict[str, object]:
    return {kv.key: _value(kv.value) for kv in key_values}


def _value(value: AnyValue) -> object:
    which = value.WhichOneof("value")
    if which == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, which) if which else None
