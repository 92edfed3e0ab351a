"""An OTLP/gRPC trace receiver inside the gateway: the stack's services export their spans here
(services/common/tracing.py, when `make run` names it in LAYERSERVE_TRACE_RECEIVER and the
operator configured no collector) and they land in the console's TraceRing.

It listens on loopback only and, like every internal port, refuses calls without the internal
token (as services/common/token_check.py does): spans name models, request ids and timings.
It serves from threads of its own, not the event loop: the gateway exports its own spans here
too, and its last flush (shutdown_tracing) blocks the event loop while it waits for the answer.
"""

from __future__ import annotations

import atexit
import ipaddress
import logging
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from services.common.internal_auth import METADATA_KEY, InternalAuth
from services.gateway.trace_ring import RingSpan, TraceRing, bounded_attributes

log = logging.getLogger(__name__)

_MAX_MESSAGE_BYTES = 16 << 20  # one export batch; the SDK sends at most 512 spans per batch


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, ring: TraceRing, auth: InternalAuth) -> None:
        self._ring = ring
        self._auth = auth

    def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        sent = dict(context.invocation_metadata() or ()).get(METADATA_KEY)
        if not self._auth.accepts(sent):
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "internal rpc without a valid internal token (LAYERSERVE_INTERNAL_TOKEN)",
            )
        self._ring.add(spans_of(request))
        return trace_service_pb2.ExportTraceServiceResponse()


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[RingSpan]:
    spans = []
    for resource_spans in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
        service = str(resource.get("service.name", "unknown"))
        for scope_spans in resource_spans.scope_spans:
            spans.extend(_ring_span(service, span) for span in scope_spans.spans)
    return spans


def loopback_address(address: str) -> str:
    """`address` (host:port) when its host is a loopback address; ValueError otherwise."""
    host, _, port = address.rpartition(":")
    try:
        loopback = ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback or not port.isdigit():
        raise ValueError(f"LAYERSERVE_TRACE_RECEIVER must be a loopback host:port, got {address!r}")
    return address


def start_receiver(address: str, ring: TraceRing, auth: InternalAuth | None = None) -> grpc.Server:
    """Serves TraceService on `address` (loopback) until the process exits."""
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="trace-receiver"),
        options=[("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)],
    )
    receiver = TraceReceiver(ring, InternalAuth.from_env() if auth is None else auth)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    server.add_insecure_port(loopback_address(address))
    server.start()
    atexit.register(server.stop, None)
    log.info("console trace receiver (OTLP/gRPC) at %s", address)
    return server


def _ring_span(service: str, span: trace_pb2.Span) -> RingSpan:
    failed = span.status.code == trace_pb2.Status.STATUS_CODE_ERROR
    return RingSpan(
        service=service,
        name=span.name[:200],
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_id=span.parent_span_id.hex(),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        attributes=bounded_attributes({kv.key: _value(kv.value) for kv in span.attributes}),
        linked_traces=tuple(dict.fromkeys(link.trace_id.hex() for link in span.links)),
        error=(span.status.message or "error")[:200] if failed else "",
    )


def _value(value: AnyValue) -> object:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which in ("kvlist_value", "bytes_value"):
        return str(getattr(value, which))
    return getattr(value, which) if which else None
