"""Who may come in, and how many at once: authentication, per-key model access, the gateway's
bound on requests in flight, per-key concurrency and rate limits, and usage accounting.

Both front ends (HTTP and gRPC) go through one FrontDoor:

    key = door.authenticate(authorization_header)  # raises Unauthenticated
    # raises NotFound (model not allowed), Unavailable (full), ResourceExhausted (key limits)
    async with door.admit(key, model, backend, requests) as metered:
        ... metered.generate(...) ...  # usage is recorded and tokens charged on exit

Overload is answered at once, never queued: a full gateway is 503, a key over its concurrency
or rate limit is 429, both with Retry-After. Admission reserves what the request may cost
against the key's token bucket (its prompt, estimated, plus n x max_tokens); the exit settles
the real count (rate_limiter.py). A key's concurrency is counted across replicas
(concurrency.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from services.common import tracing
from services.common.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from services.gateway.api_keys import ANONYMOUS, ApiKey, KeyRing, bearer_token
from services.gateway.backend import Backend, GenerationDelta, GenerationRequest, ModelCard
from services.gateway.concurrency import ConcurrencyLimiter
from services.gateway.openai_responses import UsageTally
from services.gateway.prompt_size import estimated_tokens
from services.gateway.rate_limiter import LocalBuckets, RateLimiter
from services.gateway.request_metrics import IN_FLIGHT, RATE_LIMITED, ChoiceTimer
from services.gateway.usage import Usage, UsageLedger

log = logging.getLogger(__name__)


class FrontDoor:
    def __init__(
        self,
        keys: KeyRing,
        limiter: RateLimiter | None = None,
        ledger: UsageLedger | None = None,
        *,
        max_inflight: int = 0,  # 0: unbounded
        concurrency: ConcurrencyLimiter | None = None,
    ) -> None:
        self.keys = keys
        self._limiter = limiter or RateLimiter(LocalBuckets(), fail_open=True)
        self.ledger = ledger or UsageLedger()
        self._max_inflight = max_inflight
        self._inflight = 0
        self._concurrency = concurrency or ConcurrencyLimiter()

    @property
    def inflight(self) -> int:
        return self._inflight

    def authenticate(self, authorization: str | None) -> ApiKey:
        with tracing.current_child("auth"):
            return self._authenticate(authorization)

    def _authenticate(self, authorization: str | None) -> ApiKey:
        if not self.keys.enabled:
            return ANONYMOUS
        token = bearer_token(authorization)
        if token is None:
            raise Unauthenticated("missing API key: send 'Authorization: Bearer <key>'")
        key = self.keys.find(token)
        if key is None:
            raise Unauthenticated("incorrect API key provided")
        return key

    def visible_models(self, key: ApiKey, cards: list[ModelCard]) -> list[ModelCard]:
        return [card for card in cards if key.may_use(card.id)]

    @asynccontextmanager
    async def admit(
        self, key: ApiKey, model: str, backend: Backend, requests: list[GenerationRequest]
    ) -> AsyncIterator[Backend]:
        """Holds a place for the request while the block runs; yields the backend to use,
        which meters every delta. Usage is recorded and tokens charged on the way out."""
        started = time.monotonic()  # the clock of the request's latency metrics
        if not key.may_use(model):
            # The same words as for a model that does not exist: a key learns nothing more.
            raise NotFound(
                f"The model {model!r} does not exist or you do not have access to it.",
                param="model",
            )
        _check_priority(key, requests)
        with tracing.current_child("rate_limit"):
            self._take_place()
            lease = None
            try:
                try:
                    lease = await self._concurrency.acquire(key)
                except ResourceExhausted:
                    RATE_LIMITED.labels(limit="concurrent").inc()
                    raise
                reserved = await self._limiter.admit(key, reservation(requests))
            except BaseException as err:
                if isinstance(err, ResourceExhausted) and lease is not None:
                    RATE_LIMITED.labels(limit="rate").inc()
                if lease is not None:
                    await self._concurrency.release(lease)
                self._leave()
                raise
        try:
            for request in requests:
                request.tenant = key.tenant if self.keys.enabled else ""
            metered = _MeteredBackend(backend, requests, started)
            try:
                yield metered
            finally:
                await self._settle(key, metered.tally, reserved)
        finally:
            await self._concurrency.release(lease)
            self._leave()

    def _take_place(self) -> None:
        if self._max_inflight and self._inflight >= self._max_inflight:
            error = Unavailable(
                f"the gateway is at capacity ({self._max_inflight} requests in flight); "
                "retry shortly"
            )
            error.retry_after = 1
            raise error
        self._inflight += 1
        IN_FLIGHT.inc()

    def _leave(self) -> None:
        """Gives back the place _take_place took."""
        self._inflight -= 1
        IN_FLIGHT.dec()

    async def _settle(self, key: ApiKey, tally: UsageTally, reserved: int) -> None:
        counts = tally.as_json()
        usage = Usage(
            requests=1,
            prompt_tokens=counts["prompt_tokens"],
            completion_tokens=counts["completion_tokens"],
            cached_tokens=counts["prompt_tokens_details"]["cached_tokens"],
        )
        await self._limiter.settle(key, reserved, usage.prompt_tokens + usage.completion_tokens)
        await self.ledger.record(key.tenant, usage)


def _check_priority(key: ApiKey, requests: list[GenerationRequest]) -> None:
    """A key may lower its priority, and raise it only up to its max_priority (api_keys.py)."""
    highest = max((r.priority for r in requests), default=0)
    if highest > key.max_priority:
        raise InvalidArgument(
            f"priority {highest} is over the {key.max_priority} this API key may ask for",
            param="priority",
        )


def reservation(requests: list[GenerationRequest]) -> int:
    """What the request may cost at most: its prompt (estimated from everything the model will
    read: it is not tokenized yet) plus every choice's max_tokens (an embedding generates none)."""
    if not requests:
        return 0
    if requests[0].embed:  # one prompt per input
        return sum(map(estimated_tokens, requests))
    return estimated_tokens(requests[0]) + sum(r.max_tokens.limit for r in requests)


class _MeteredBackend:
    """Passes requests through to the real backend, tallying the tokens of each delta and
    timing each choice (TTFT, ITL, TPOT, end to end: request_metrics.py)."""

    def __init__(self, backend: Backend, requests: list[GenerationRequest], started: float) -> None:
        self._backend = backend
        self._started = started
        self._index = {r.request_id: i for i, r in enumerate(requests)}
        shared = not requests or not requests[0].embed  # the choices of one prompt
        self.tally = UsageTally(max(1, len(requests)), shared_prompt=shared)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        index = self._index.get(request.request_id, 0)
        timer = ChoiceTimer(self._started, request.model, request.trace_context)
        deltas = self._backend.generate(request)
        try:
            async for delta in deltas:
                self.tally.add(index, delta)
                timer.add(delta)
                yield delta
        finally:
            await deltas.aclose()

    async def list_models(self) -> list[ModelCard]:
        return await self._backend.list_models()
