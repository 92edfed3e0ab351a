"""A server interceptor that knows how many RPCs are in progress and, once closed for a drain,
refuses new ones with UNAVAILABLE and a message that says why. Health checks always pass and
are not counted: a load balancer must keep seeing NOT_SERVING while the server drains."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable

import grpc

from services.common.health import HEALTH_METHOD_PREFIX

_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
_FIRST_MESSAGE_WAIT_S = 1.0


class DrainGate(grpc.aio.ServerInterceptor):
    def __init__(self, what: str) -> None:
        self._what = what  # "the scheduler", for the refusal message
        self.in_flight = 0
        self.closed = False

    def close(self) -> None:
        """From now on every new RPC but health checks ends with UNAVAILABLE."""
        self.closed = True

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_METHOD_PREFIX):
            return handler
        for kind in _BEHAVIOURS:
            behaviour = getattr(handler, kind)
            if behaviour is None:
                continue
            if self.closed:
                wrapped = self._refusing(behaviour, handler.request_streaming)
            else:
                wrapped = self._counted(behaviour)
            return handler._replace(**{kind: wrapped})
        return handler

    def _refusing(self, behaviour, request_streaming: bool):
        message = f"{self._what} is shutting down; retry on another replica or shortly"

        async def refuse(request, context):
            if request_streaming:
                # Let the client's first write land: refused before it, that write fails on
                # the client as INTERNAL ("Internal error from Core") instead of this status.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(anext(aiter(request)), _FIRST_MESSAGE_WAIT_S)
            await context.abort(grpc.StatusCode.UNAVAILABLE, message)

        if inspect.isasyncgenfunction(behaviour):

            async def refuse_stream(request, context):
                await refuse(request, context)
                yield  # pragma: no cover (abort raises); makes this an async generator

            return refuse_stream
        return refuse

    def _counted(self, behaviour):
        if inspect.isasyncgenfunction(behaviour):

            async def counted_stream(request, context):
                self.in_flight += 1
                try:
                    async with contextlib.aclosing(behaviour(request, context)) as responses:
                        async for response in responses:
                            yield response
                finally:
                    self.in_flight -= 1

            return counted_stream

        async def counted(request, context):
            self.in_flight += 1
            try:
                return await behaviour(request, context)
            finally:
                self.in_flight -= 1

        return counted
