"""The public gateway.v1.Gateway gRPC API, on the same Backend as the HTTP API."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import uuid
from collections.abc import AsyncIterator

import grpc
from opentelemetry.trace import Span

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.common import tracing
from services.common.errors import InvalidArgument, LayerserveError
from services.common.sampling import SamplingOptions
from services.gateway import request_span
from services.gateway.api_keys import ApiKey
from services.gateway.backend import Backend, ChatMessage, GenerationRequest
from services.gateway.front_door import FrontDoor
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from services.gateway.request_metrics import count_error, error_code

log = logging.getLogger(__name__)

_FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH}


def request_from_proto(
    msg: gateway_pb2.GenerateRequest,
    request_id: str,
    trace_context: dict[str, str],
    limits: RequestLimits = DEFAULT_LIMITS,
) -> GenerationRequest:
    if not msg.model:
        raise InvalidArgument("model is required", param="model")
    if msg.HasField("max_tokens") and not 1 <= msg.max_tokens <= (limits.max_tokens or 2**31):
        bound = f"between 1 and {limits.max_tokens}" if limits.max_tokens else "at least 1"
        raise InvalidArgument(
            f"max_tokens must be {bound}, got {msg.max_tokens}", param="max_tokens"
        )
    if len(msg.stop) > limits.max_stop_sequences:
        raise InvalidArgument(
            f"stop takes at most {limits.max_stop_sequences} sequences, got {len(msg.stop)}",
            param="stop",
        )
    sampling = SamplingOptions.from_proto(msg.sampling)
    sampling.validate()
    req = GenerationRequest(
        request_id=request_id,
        model=msg.model,
        max_tokens=msg.max_tokens if msg.HasField("max_tokens") else limits.max_tokens,
        sampling=sampling,
        stop=list(msg.stop),
        ignore_eos=msg.ignore_eos,
        trace_context=trace_context,
        max_prompt_tokens=limits.max_prompt_tokens,
    )
    which = msg.WhichOneof("input")
    if which == "prompt":
        req.prompt = msg.prompt
    elif which == "chat" and msg.chat.messages:
        req.messages = [ChatMessage(m.role, m.content) for m in msg.chat.messages]
    else:
        raise InvalidArgument("give a prompt or at least one chat message", param="prompt")
    return req


class GatewayServicer(gateway_pb2_grpc.GatewayServicer):
    def __init__(
        self,
        backend: Backend,
        front_door: FrontDoor,
        limits: RequestLimits = DEFAULT_LIMITS,
    ) -> None:
        self._backend = backend
        self._door = front_door
        self._limits = limits

    async def _authorize(self, context: grpc.aio.ServicerContext) -> tuple[ApiKey, dict]:
        """Aborts with UNAUTHENTICATED unless the key is good; returns it and the metadata."""
        metadata = dict(context.invocation_metadata() or ())
        try:
            key = self._door.authenticate(metadata.get("authorization"))
        except LayerserveError as err:
            count_error(error_code(err))
            await context.abort(
                err.grpc_code, f"{err.message} (metadata authorization: Bearer KEY)"
            )
        return key, metadata

    async def Generate(self, request, context) -> AsyncIterator[gateway_pb2.GenerateResponse]:
        request_id = f"gen-{uuid.uuid4().hex}"
        # The request's span is current only around the front door's checks, never across a
        # yield: this generator may be finalized in another task.
        span = request_span.start_grpc(context)
        try:
            with tracing.use(span):
                key, metadata = await self._authorize(context)
            trace = tracing.forward(span, request_span.client_context(metadata))
            req = request_from_proto(request, request_id, trace, self._limits)
            request_span.describe(span, request_id, [req])
            async with contextlib.AsyncExitStack() as stack:
                with tracing.use(span):
                    door = self._door.admit(key, req.model, self._backend, [req])
                    backend = await stack.enter_async_context(door)
                responses = _deliver(span, backend, req)
                try:
                    async for response in responses:
                        yield response
                finally:
                    await responses.aclose()  # now, not when collected: it aborts the request
                request_span.settle(span, getattr(backend, "tally", None))
        except LayerserveError as err:
            count_error(error_code(err))
            retry_after = getattr(err, "retry_after", None)
            if retry_after is not None:  # overload: say when to come back, as HTTP does
                context.set_trailing_metadata((("retry-after", str(retry_after)),))
            await context.abort(err.grpc_code, err.message)
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
            request_span.end_grpc(span, context.code(), request_id, sys.exc_info()[1])

    async def ListModels(self, request, context) -> gateway_pb2.ListModelsResponse:
        key, _ = await self._authorize(context)
        try:
            models = self._door.visible_models(key, await self._backend.list_models())
        except LayerserveError as err:
            count_error(error_code(err))
            await context.abort(err.grpc_code, err.message)
        return gateway_pb2.ListModelsResponse(
            models=[gateway_pb2.Model(id=m.id, max_model_len=m.max_model_len) for m in models]
        )


async def _deliver(
    span: Span | None, backend: Backend, req: GenerationRequest
) -> AsyncIterator[gateway_pb2.GenerateResponse]:
    """The choice's deltas as responses; a `deliver` span from the first to the last."""
    deliver = None
    deltas = backend.generate(req)
    try:
        async for delta in deltas:
            if deliver is None and span is not None:
                deliver = tracing.start_span("deliver", span)
            yield _response(delta, req.request_id)
    finally:
        tracing.finish(deliver)
        await deltas.aclose()


def _response(delta, request_id: str) -> gateway_pb2.GenerateResponse:
    return gateway_pb2.GenerateResponse(
        text=delta.text,
        token_ids=delta.token_ids,
        finish_reason=_FINISH.get(delta.finish_reason or "", 0),
        prompt_tokens=delta.prompt_tokens,
        completion_tokens=delta.completion_tokens,
        cached_tokens=delta.cached_tokens,
        request_id=request_id,
    )
