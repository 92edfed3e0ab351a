"""A server interceptor that refuses every rpc without the internal token with UNAUTHENTICATED
(services/common/internal_auth.py). Health checks stay open: load balancers, probes and the
launcher ask them without credentials, and they reveal nothing but SERVING or not."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable

import grpc

from services.common.health import HEALTH_METHOD_PREFIX
from services.common.internal_auth import METADATA_KEY, InternalAuth

log = logging.getLogger(__name__)

_BEHAVIOURS = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
_FIRST_MESSAGE_WAIT_S = 1.0
_LOG_EVERY_S = 10.0  # refusals are logged at most this often (a flood must not flood the log)


class TokenCheck(grpc.aio.ServerInterceptor):
    def __init__(self, auth: InternalAuth) -> None:
        self._auth = auth
        self.refused = 0
        self._logged_at = -_LOG_EVERY_S
        self._unlogged = 0

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith(HEALTH_METHOD_PREFIX):
            return handler
        sent = dict(details.invocation_metadata or ()).get(METADATA_KEY)
        if self._auth.accepts(sent):
            return handler
        self._note_refusal(details.method, "a wrong" if sent else "no")
        return _refusing(handler)

    def _note_refusal(self, method: str, which: str) -> None:
        self.refused += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            log.warning(
                "refused %d call(s) without the internal token (latest: %s with %s token)",
                self._unlogged,
                method,
                which,
            )
            self._logged_at, self._unlogged = now, 0


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    message = "internal rpc without a valid internal token (LAYERSERVE_INTERNAL_TOKEN)"
    for kind in _BEHAVIOURS:
        behaviour = getattr(handler, kind)
        if behaviour is None:
            continue

        async def refuse(request, context):
            if handler.request_streaming:
                # Let the client's first write land: refused before it, that write fails on
                # the client as INTERNAL instead of this status (as in drain_gate.py).
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(anext(aiter(request)), _FIRST_MESSAGE_WAIT_S)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        if inspect.isasyncgenfunction(behaviour):

            async def refuse_stream(request, context):
                await refuse(request, context)
                yield  # pragma: no cover (abort raises); makes this an async generator

            return handler._replace(**{kind: refuse_stream})
        return handler._replace(**{kind: refuse})
    return handler
