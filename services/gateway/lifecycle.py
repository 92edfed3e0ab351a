"""The gateway's readiness and drain, shared by its HTTP and gRPC fronts.

Ready: not draining, and its tokenizer service reports SERVING (which it does only while its
scheduler does, which needs a live worker). The tokenizer is probed with a short timeout and
the answer kept for a second, so that probes from load balancers never hammer the stack.

Draining (after SIGTERM): /ready answers 503, new HTTP requests get 503 with Retry-After and an
OpenAI error body, and the requests in progress (`in_flight`) are left to finish.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from services.common.errors import Unavailable
from services.gateway.http_json import error_response

Probe = Callable[[], Awaitable[str | None]]  # why the dependency is not ready, or None
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

CACHE_SECONDS = 1.0
# Liveness, readiness and the metrics answer during a drain too: that is when they matter.
PROBE_PATHS = frozenset({"/health", "/ready", "/metrics"})
SHUTTING_DOWN = "the gateway is shutting down; retry on another replica or shortly"


class Lifecycle:
    def __init__(
        self,
        probe: Probe,
        cache_s: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._probe = probe
        self._cache_s = cache_s
        self._clock = clock
        self._answer: str | None = "not probed yet"
        self._answered_at = -float("inf")
        self._probing: asyncio.Task[str | None] | None = None
        self.draining = False
        self.in_flight = 0  # HTTP requests past this middleware, not yet answered

    async def problem(self) -> str | None:
        """Why the gateway is not ready, or None. At most one probe per cache period; callers
        that arrive while one runs share it."""
        if self.draining:
            return SHUTTING_DOWN
        if self._clock() - self._answered_at < self._cache_s:
            return self._answer
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._probe_once())
        return await asyncio.shield(self._probing)

    async def _probe_once(self) -> str | None:
        answer = await self._probe()
        self._answer, self._answered_at = answer, self._clock()
        return answer

    def begin_drain(self) -> None:
        self.draining = True

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBE_PATHS:
            return await handler(request)
        if self.draining:
            return error_response(Unavailable(SHUTTING_DOWN))  # with Retry-After
        self.in_flight += 1
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1


LIFECYCLE = web.AppKey("lifecycle", Lifecycle)
