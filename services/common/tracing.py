"""OpenTelemetry tracing, configured once per process.

On only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set:
spans then go over OTLP/gRPC to that collector (Jaeger listens on 4317), named by
`OTEL_SERVICE_NAME` (default layerserve-<service>) and sampled as `OTEL_TRACES_SAMPLER` /
`OTEL_TRACES_SAMPLER_ARG` say (the SDK reads them; default: parent-based, always on). Off, the
SDK is never imported and every helper here returns None or a shared null context: the hooks
in the services cost one `is None` test.

Context crosses the hops per request as a W3C `traceparent`/`tracestate` carrier inside the
messages (common.v1.TraceContext), since the streams between services carry many requests.
Parents are passed explicitly (a carrier or a span), never through the ambient context across
an `await` that other requests share; only front ends make their request span current, for
the checks they run inline. A span that is not recording (sampled out) still passes its
context on, so every service follows the same sampling decision, but gets no attributes.
Prompt and completion text never goes into a span.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Link, Span, SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common.env import PREFIX
from services.common.internal_auth import InternalAuth

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

log = logging.getLogger(__name__)

_PROPAGATOR = TraceContextTextMapPropagator()
_NULL: AbstractContextManager[None] = contextlib.nullcontext()
_provider = None
_tracer: trace.Tracer | None = None  # None: tracing is off
CONSOLE_EXPORT_TIMEOUT_S = 1.0  # an export to the console's receiver gives up after this

# A span's parent: a W3C carrier (from a message or headers; empty = start a new trace) or a span.
Parent = Mapping[str, str] | Span

SERVER = SpanKind.SERVER
CLIENT = SpanKind.CLIENT
INTERNAL = SpanKind.INTERNAL


def setup_tracing(service: str) -> bool:
    """Installs the OTLP exporter when an endpoint is configured; True when tracing is on.
    Without one, LAYERSERVE_TRACE_RECEIVER (host:port, set by `make run`) names the gateway's
    own receiver for its console (services/gateway/trace_receiver.py): the spans go there with
    the internal token, within half a second."""
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", ""
    )
    console = os.environ.get(f"{PREFIX}TRACE_RECEIVER", "") if not endpoint else ""
    endpoint = endpoint or console
    if not endpoint or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    name = os.environ.get("OTEL_SERVICE_NAME") or f"layerserve-{service}"
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    # A bare host:port (Jaeger's own examples) means plain gRPC; a scheme says it.
    insecure = True if "://" not in endpoint else None
    # Only the stack's own receiver gets the internal token, never an operator's collector.
    headers = dict(InternalAuth.from_env().metadata) if console else None
    # The console's receiver is the gateway, which a stop ends first: the other services'
    # last spans would be retried for the exporter's 10 s, each service's exit waiting on it.
    timeout = {"timeout": CONSOLE_EXPORT_TIMEOUT_S} if console else {}
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=insecure, headers=headers, **timeout)
    delay = {"schedule_delay_millis": 500} if console else {}
    provider.add_span_processor(BatchSpanProcessor(exporter, **delay))
    trace.set_tracer_provider(provider)  # for any library that traces through the global API
    install(provider, service)
    log.info("tracing to %s as %s", endpoint, name)
    return True


def install(provider: TracerProvider, service: str) -> None:
    """Traces into `provider` from now on (setup_tracing's last step; tests install an SDK
    provider with an in-memory exporter)."""
    global _provider, _tracer
    _provider = provider
    _tracer = provider.get_tracer(f"layerserve.{service}")


def shutdown_tracing() -> None:
    """Exports the spans still buffered (after the drain, before exit)."""
    global _provider, _tracer
    if _provider is not None:
        _tracer = None
        _provider.shutdown()
        _provider = None


def enabled() -> bool:
    return _tracer is not None


def start_span(
    name: str,
    parent: Parent,
    *,
    kind: SpanKind = INTERNAL,
    links: Sequence[Span] = (),
    attributes: Mapping[str, object] | None = None,
) -> Span | None:
    """A started span (end it with `finish`), or None when tracing is off. `links`: spans this
    one served or followed (an engine step links the requests it ran)."""
    if _tracer is None:
        return None
    span_links = [
        Link(s.get_span_context()) for s in links if s.get_span_context().trace_flags.sampled
    ]
    return _tracer.start_span(
        name, _context_of(parent), kind, attributes=attributes, links=span_links
    )


def recording(span: Span | None) -> bool:
    """Whether attributes and events on `span` are kept (it exists and was sampled)."""
    return span is not None and span.is_recording()


def carrier_of(span: Span) -> dict[str, str]:
    """The W3C carrier that makes a span in another service a child of `span`."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def sampled_trace_id(carrier: Mapping[str, str]) -> str | None:
    """The trace id (32 hex digits) of a W3C carrier, when this process traces and the trace is
    sampled (a metric's exemplar then names a trace that exists); else None."""
    if _tracer is None or not carrier:
        return None
    context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    return trace.format_trace_id(context.trace_id)


def forward(span: Span | None, received: Mapping[str, str]) -> dict[str, str]:
    """The carrier to send on: `span`'s when this process traces, else what it received (so a
    stack whose middle does not trace still links its ends)."""
    return carrier_of(span) if span is not None else dict(received)


def finish(span: Span | None, error: BaseException | str | None = None) -> None:
    """Ends `span`, marked as failed when `error` is given (only its type goes into the span:
    error messages may quote what the client sent)."""
    if span is None:
        return
    if error is not None and span.is_recording():
        kind = error if isinstance(error, str) else type(error).__name__
        span.set_status(StatusCode.ERROR, kind)
        span.set_attribute("error.type", kind)
    span.end()


def child(
    name: str, parent: Span | None, attributes: Mapping[str, object] | None = None
) -> AbstractContextManager[Span | None]:
    """`with child("tokenize", span):` a span under `parent` for the block (failed if the block
    raises); a null context when `parent` is None (tracing off)."""
    if parent is None or _tracer is None:
        return _NULL
    return _child(name, parent, attributes)


def current_child(name: str) -> AbstractContextManager[Span | None]:
    """A span under the current one (see `use`) for the block; a null context when tracing is
    off or no span is current."""
    if _tracer is None:
        return _NULL
    parent = trace.get_current_span()
    if not parent.get_span_context().is_valid:
        return _NULL
    return _child(name, parent, None)


def use(span: Span | None) -> AbstractContextManager[object]:
    """Makes `span` current for the block, without ending it (for `current_child`). Only around
    code that runs for this request alone: never across a yield of an async generator."""
    if span is None:
        return _NULL
    return trace.use_span(
        span, end_on_exit=False, record_exception=False, set_status_on_exception=False
    )


@contextlib.contextmanager
def _child(name: str, parent: Span, attributes: Mapping[str, object] | None) -> Iterator[Span]:
    assert _tracer is not None
    span = _tracer.start_span(name, trace.set_span_in_context(parent), attributes=attributes)
    try:
        yield span
    except BaseException as exc:
        finish(span, exc)
        raise
    span.end()


def _context_of(parent: Parent) -> otel_context.Context:
    if isinstance(parent, Span):
        return trace.set_span_in_context(parent)
    # An empty context, not the current one: no carrier means a new trace.
    return _PROPAGATOR.extract(parent, context=otel_context.Context())
