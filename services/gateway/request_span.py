"""The gateway's span for one client request (HTTP or gRPC): it continues the client's W3C
trace context, holds the front door's checks (`auth`, `rate_limit`) and one span per choice
(tokenizer_client.py), and says what was asked and what it cost in GenAI attributes.

Every function takes the span or None (tracing off) and does nothing with None.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc
from opentelemetry.trace import Span

from layerserve.common.v1 import common_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common import span_attributes as attrs
from services.common import tracing
from services.gateway.backend import GenerationRequest
from services.gateway.openai_responses import UsageTally

GRPC_GENERATE = "layerserve.gateway.v1.Gateway/Generate"
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context
_FINISH_NAMES = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_ABORT: "abort",
}
_STATUS_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}
# Codes that mark the server span failed (the others are the caller's doing), as the RPC
# semantic conventions say.
_SERVER_FAULTS = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)


def client_context(headers: Mapping[str, str]) -> dict[str, str]:
    """The client's W3C trace context from HTTP headers or gRPC metadata."""
    return {name: headers[name] for name in TRACE_HEADERS if name in headers}


def operation_of(request: GenerationRequest) -> str:
    return attrs.CHAT if request.messages is not None else attrs.TEXT_COMPLETION


def start_http(method: str, route: str, headers: Mapping[str, str]) -> Span | None:
    return tracing.start_span(
        f"{method} {route}",
        client_context(headers),
        kind=tracing.SERVER,
        attributes={"http.request.method": method, "http.route": route, "url.path": route},
    )


def start_grpc(context: grpc.aio.ServicerContext) -> Span | None:
    if not tracing.enabled():
        return None
    service, method = GRPC_GENERATE.rsplit("/", 1)
    return tracing.start_span(
        GRPC_GENERATE,
        client_context(dict(context.invocation_metadata() or ())),
        kind=tracing.SERVER,
        attributes={"rpc.system": "grpc", "rpc.service": service, "rpc.method": method},
    )


def describe(span: Span | None, response_id: str, requests: list[GenerationRequest]) -> None:
    """What the client asked for (the choices share model and settings)."""
    if not requests or not tracing.recording(span):
        return
    first = requests[0]
    span.set_attributes(
        attrs.request_attributes(
            first.model, first.max_tokens.limit, first.sampling, operation_of(first)
        )
    )
    span.set_attribute("gen_ai.response.id", response_id)
    if len(requests) > 1:
        span.set_attribute("gen_ai.request.choice.count", len(requests))


def settle(span: Span | None, tally: UsageTally | None) -> None:
    """The tokens the request used, all choices together."""
    if tally is None or not tracing.recording(span):
        return
    usage = tally.as_json()
    span.set_attributes(attrs.usage_attributes(usage["prompt_tokens"], usage["completion_tokens"]))
    span.set_attribute(attrs.CACHED_TOKENS, usage["prompt_tokens_details"]["cached_tokens"])


def end_http(span: Span | None, status: int | None, request_id: str) -> None:
    """status None: the handler ended without an answer (the client went away). request_id:
    the one the client sees, which finds the trace in Jaeger."""
    if span is None:
        return
    if tracing.recording(span):
        span.set_attribute(attrs.REQUEST_ID, request_id)
        if status is not None:
            span.set_attribute("http.response.status_code", status)
        if status is not None and status >= 400:
            span.set_attribute("error.type", str(status))
    if status is None:
        tracing.finish(span, "cancelled")
    else:
        tracing.finish(span, str(status) if status >= 500 else None)


def end_grpc(
    span: Span | None, code: object, request_id: str, error: BaseException | None = None
) -> None:
    """code: what the servicer context holds (set by an abort); error: what ended the call,
    if anything did."""
    if span is None:
        return
    status = _STATUS_BY_NUMBER.get(getattr(code, "value", (code,))[0], grpc.StatusCode.OK)
    if status is grpc.StatusCode.OK and error is not None:
        cancelled = isinstance(error, asyncio.CancelledError | GeneratorExit)
        status = grpc.StatusCode.CANCELLED if cancelled else grpc.StatusCode.UNKNOWN
    if tracing.recording(span):
        span.set_attribute(attrs.REQUEST_ID, request_id)
        span.set_attribute("rpc.grpc.status_code", status.value[0])
        if status is not grpc.StatusCode.OK:
            span.set_attribute("error.type", status.name)
    tracing.finish(span, status.name if status in _SERVER_FAULTS else None)


def start_choice(request: GenerationRequest) -> Span | None:
    """One choice's span, a child of the request's (request.trace_context): its context goes
    to the tokenizer service with the request."""
    if not tracing.enabled():
        return None
    span = tracing.start_span(
        f"{operation_of(request)} {request.model}", request.trace_context, kind=tracing.CLIENT
    )
    if tracing.recording(span):
        span.set_attributes(
            attrs.request_attributes(
                request.model, request.max_tokens.limit, request.sampling, operation_of(request)
            )
        )
        span.set_attribute(attrs.CHOICE_ID, request.request_id)
    return span


def choice_finished(span: Span | None, output: tokenizer_pb2.GenerateOutput) -> None:
    """The choice's last output: what it cost and why it ended."""
    if not tracing.recording(span):
        return
    reason = _FINISH_NAMES.get(output.finish_reason, "error")
    span.set_attributes(
        attrs.usage_attributes(output.prompt_tokens, output.completion_tokens, reason)
    )
    span.set_attribute(attrs.CACHED_TOKENS, output.cached_tokens)
    if output.model:
        span.set_attribute("gen_ai.response.model", output.model)
