"""The public gateway.v1.Gateway gRPC API, on the same Backend as the HTTP API.

Requests go through the HTTP API's validator (request_validator.py) and front door, and their
deltas through the same bounded buffer (choice_streams.py): a client that takes no message for
stalled_client_seconds is cut off and its request aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import uuid

import grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.trace import Span, format_trace_id

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.common import tracing
from services.common.errors import InvalidArgument, LayerserveError
from services.common.grpc_status import grpc_code
from services.common.grpc_util import SERVER_OPTIONS
from services.common.max_tokens import MaxTokens
from services.common.sampling_proto import sampling_from_proto
from services.gateway import request_span
from services.gateway.api_keys import ApiKey
from services.gateway.backend import (
    MODEL_DEFAULT_FIELDS,
    Backend,
    ChatMessage,
    GenerationRequest,
    Tool,
    ToolCall,
)
from services.gateway.choice_streams import ChoiceStreams, ClientStalled, coalesce, write_within
from services.gateway.front_door import FrontDoor
from services.gateway.grammar_check import check_grammars
from services.gateway.grpc_embed import embed
from services.gateway.prompt_guard import PromptGuard
from services.gateway.prompt_size import check_count
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from services.gateway.request_metrics import count_error, error_code
from services.gateway.request_validator import validate_request
from services.gateway.trace_ring import TraceOwner, TraceRing

log = logging.getLogger(__name__)

_FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH}


def public_server(
    limits: RequestLimits, interceptors: list[grpc.aio.ServerInterceptor]
) -> grpc.aio.Server:
    """The public gRPC server: it takes no message larger than an HTTP body may be, so a
    20 MB prompt is refused by gRPC itself (RESOURCE_EXHAUSTED) before anything reads it; a
    compressed message too (gRPC checks the size it inflates to). As at the HTTP door, a
    connection gets http_idle_timeout_s to finish its handshake and is closed (GOAWAY) when
    it has had no call for as long."""
    idle_ms = round(limits.http_idle_timeout_s * 1000)
    options = [(k, v) for k, v in SERVER_OPTIONS if k != "grpc.max_receive_message_length"]
    options += [
        ("grpc.max_receive_message_length", limits.max_body_bytes),
        ("grpc.server_handshake_timeout_ms", idle_ms),
        ("grpc.max_connection_idle_ms", idle_ms),
    ]
    server = grpc.aio.server(options=options, interceptors=interceptors)
    # Reflection: grpcurl and friends list and call the API without the .proto files.
    names = (
        gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name,
        "grpc.health.v1.Health",
        reflection.SERVICE_NAME,
    )
    reflection.enable_server_reflection(names, server)
    return server


def request_from_proto(
    msg: gateway_pb2.GenerateRequest,
    request_id: str,
    trace_context: dict[str, str],
    limits: RequestLimits = DEFAULT_LIMITS,
) -> GenerationRequest:
    """The request, checked by the validator the HTTP API uses (request_validator.py)."""
    req = GenerationRequest(
        request_id=request_id,
        model=msg.model,
        max_tokens=MaxTokens(msg.max_tokens),
        sampling=sampling_from_proto(msg.sampling),
        # No sampling message: the model's recommended settings (else greedy, as before).
        sampling_unset=() if msg.HasField("sampling") else MODEL_DEFAULT_FIELDS,
        stop=list(msg.stop),
        ignore_eos=msg.ignore_eos,
        trace_context=trace_context,
        max_prompt_tokens=limits.max_prompt_tokens,
    )
    if msg.sampling.HasField("prompt_logprobs"):  # GenerateResponse has no logprobs
        param = "sampling.prompt_logprobs"
        raise InvalidArgument(f"{param} is not supported over gRPC", param=param)
    which = msg.WhichOneof("input")
    if which == "prompt":
        req.prompt = msg.prompt
    elif which == "chat":
        _check_counts(msg, limits)  # before anything is built from them
        req.messages = [_message(m) for m in msg.chat.messages]
    else:
        raise InvalidArgument("prompt or chat is required", param="prompt")
    _add_tools(req, msg)
    validate_request(req, 1, limits, "max_tokens" if msg.HasField("max_tokens") else None)
    return req


def _check_counts(msg: gateway_pb2.GenerateRequest, limits: RequestLimits) -> None:
    check_count(len(msg.chat.messages), limits.max_messages, "messages")
    check_count(len(msg.tools), limits.max_tools, "tools")
    for i, m in enumerate(msg.chat.messages):
        check_count(len(m.tool_calls), limits.max_tools, f"messages[{i}].tool_calls")


_TOOL_CHOICE = {
    gateway_pb2.TOOL_CHOICE_UNSPECIFIED: "",
    gateway_pb2.TOOL_CHOICE_NONE: "none",
    gateway_pb2.TOOL_CHOICE_AUTO: "auto",
    gateway_pb2.TOOL_CHOICE_REQUIRED: "required",
}


def _message(m: gateway_pb2.ChatMessage) -> ChatMessage:
    calls = [ToolCall(c.id, c.name, c.arguments, i) for i, c in enumerate(m.tool_calls)]
    return ChatMessage(m.role, m.content, calls, m.tool_call_id, m.name)


def _add_tools(req: GenerationRequest, msg: gateway_pb2.GenerateRequest) -> None:
    req.structured_param = "sampling.structured"
    req.tools = [Tool(t.name, t.description, t.parameters) for t in msg.tools]
    req.tool_choice = _TOOL_CHOICE.get(msg.tool_choice, "")
    req.tool_choice_function = msg.tool_choice_function
    if msg.HasField("parallel_tool_calls"):
        req.parallel_tool_calls = msg.parallel_tool_calls


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(
        self,
        backend: Backend,
        front_door: FrontDoor,
        limits: RequestLimits = DEFAULT_LIMITS,
        ring: TraceRing | None = None,
    ) -> None:
        """ring: the console's (console_routes.RING), where calls are listed as HTTP's are."""
        self._backend = backend
        self._door = front_door
        self._limits = limits
        self._prompt_guard = PromptGuard(backend, limits)
        self._ring = ring

    def _claim(self, span: Span | None, key: ApiKey, request_id: str) -> TraceOwner | None:
        """Files the call's trace under its caller in the console's ring, as console_routes
        does for an HTTP request; only a sampled one (a sampled-out one sends no spans)."""
        context = span.get_span_context() if span is not None else None
        if self._ring is None or not (context and context.is_valid and context.trace_flags.sampled):
            return None
        owner = TraceOwner(key.tenant, request_id, request_span.GRPC_GENERATE)
        self._ring.claim(format_trace_id(context.trace_id), owner)
        return owner

    async def _authorize(self, context: grpc.aio.ServicerContext) -> tuple[ApiKey, dict]:
        """Aborts with UNAUTHENTICATED unless the key is good; returns it and the metadata."""
        metadata = dict(context.invocation_metadata() or ())
        try:
            key = self._door.authenticate(metadata.get("authorization"))
        except LayerserveError as err:
            count_error(error_code(err))
            await context.abort(
                grpc_code(err), f"{err.message} (metadata authorization: Bearer KEY)"
            )
        return key, metadata

    async def Generate(self, request, context) -> None:
        """Streams with context.write rather than yield: a write can be given a time limit."""
        request_id = f"gen-{uuid.uuid4().hex}"
        span = request_span.start_grpc(context)
        owner = None
        try:
            with tracing.use(span):
                key, metadata = await self._authorize(context)
            owner = self._claim(span, key, request_id)
            trace = tracing.forward(span, request_span.client_context(metadata))
            req = request_from_proto(request, request_id, trace, self._limits)
            await self._prompt_guard.check(req)
            request_span.describe(span, request_id, [req])
            async with contextlib.AsyncExitStack() as stack:
                with tracing.use(span):
                    door = self._door.admit(key, req.model, self._backend, [req])
                    backend = await stack.enter_async_context(door)
                await check_grammars(req)  # off the event loop
                await _deliver(context, span, backend, req, self._limits.stalled_client_seconds)
                request_span.settle(span, getattr(backend, "tally", None))
        except ClientStalled as stalled:
            log.warning("request %s: %s; cut off and aborted", request_id, stalled)
            count_error("cancelled")
            await context.abort(grpc.StatusCode.CANCELLED, f"{stalled}; cut off")
        except LayerserveError as err:
            count_error(error_code(err))
            retry_after = getattr(err, "retry_after", None)
            if retry_after is not None:  # overload: say when to come back, as HTTP does
                context.set_trailing_metadata((("retry-after", str(retry_after)),))
            await context.abort(grpc_code(err), err.message)
        except grpc.aio.AbortError:
            raise
        except asyncio.CancelledError:  # the client cancelled the call or went away
            count_error("cancelled")
            raise
        except Exception:
            count_error("internal")
            log.exception("request %s failed", request_id)
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error (request {request_id})")
        finally:
            if owner is not None:
                owner.done = True
            request_span.end_grpc(span, context.code(), request_id, sys.exc_info()[1])

    async def Embed(self, request, context) -> gateway_pb2.EmbedResponse:
        request_id = f"embd-{uuid.uuid4().hex}"
        span = request_span.start_grpc(context)
        try:
            with tracing.use(span):
                key, metadata = await self._authorize(context)
                trace = tracing.forward(span, request_span.client_context(metadata))
                return await embed(
                    request, request_id, trace, key, self._door, self._backend, self._limits
                )
        except LayerserveError as err:
            count_error(error_code(err))
            await context.abort(grpc_code(err), err.message)
        except asyncio.CancelledError:  # the client cancelled the call or went away
            count_error("cancelled")
            raise
        finally:
            request_span.end_grpc(span, context.code(), request_id, sys.exc_info()[1])

    async def ListModels(self, request, context) -> gateway_pb2.ListModelsResponse:
        key, _ = await self._authorize(context)
        try:
            models = self._door.visible_models(key, await self._backend.list_models())
        except LayerserveError as err:
            count_error(error_code(err))
            await context.abort(grpc_code(err), err.message)
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.Model(id=m.id, max_model_len=m.max_model_len) for m in models]
        )


async def _deliver(
    context: grpc.aio.ServicerContext,
    span: Span | None,
    backend: Backend,
    req: GenerationRequest,
    stalled_client_seconds: float,
) -> None:
    """The choice's deltas as responses, merged while the client reads slowly; a `deliver`
    span from the first to the last. Raises the choice's error, or ClientStalled."""
    deliver = None
    streams = ChoiceStreams(backend, [req])
    try:
        while not streams.finished:
            merged, error = coalesce(await streams.next_batch())
            if error is not None:
                raise error
            for delta in merged.values():
                if deliver is None and span is not None:
                    deliver = tracing.start_span("deliver", span)
                response = _response(delta, req.request_id)
                await write_within(context.write(response), stalled_client_seconds)
    finally:
        streams.close()  # aborts the request upstream unless it finished
        tracing.finish(deliver)


def _response(delta, request_id: str) -> gateway_pb2.GenerateResponse:
    return gateway_pb2.GenerateResponse(
        text=delta.text,
        token_ids=delta.token_ids,
        finish_reason=_FINISH.get(delta.finish_reason or "", 0),
        prompt_tokens=delta.prompt_tokens,
        completion_tokens=delta.completion_tokens,
        cached_tokens=delta.cached_tokens,
        request_id=request_id,
        tool_calls=[
            gateway_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments, index=c.index)
            for c in delta.tool_calls
        ],
    )
