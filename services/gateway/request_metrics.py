"""What the gateway measures, as the client sees it, and its GET /metrics.

Per choice (an OpenAI request with n=2 is observed twice), from the moment the front door
starts admitting the request: the time to its first generated token, every gap between two
consecutive tokens (inter-token latency; tokens that arrive in one delta share the gap since the
previous delta evenly, so the gaps add up to last - first), the mean time per output token after
the first ((last - first) / (completion tokens - 1)), and the end-to-end latency once it
finishes, with the model that served it (an alias's target). When the request is traced, the
latency observations carry its trace id as an OpenMetrics exemplar (Grafana links it to
Jaeger). Every request that ends in an error counts once under `code`: the `code` of the
OpenAI error body it got (for the stack's own errors the gRPC status name, lowercased:
`resource_exhausted`, `invalid_argument`, ...), with `cancelled` for a client that went away
before its answer ended. Prompt and generation token counts are the scheduler's
(services/scheduler/scheduler_metrics.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from http import HTTPStatus

from aiohttp import web

from services.common import metrics, tracing
from services.common.errors import (
    Cancelled,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    LayerserveError,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from services.common.metrics_page import render
from services.gateway.backend import GenerationDelta

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

TIME_TO_FIRST_TOKEN = metrics.histogram(
    "time_to_first_token_seconds",
    "Time from a request's admission at the gateway to its first generated token, per choice.",
    metrics.LATENCY_BUCKETS,
    ("model",),
)
INTER_TOKEN_LATENCY = metrics.histogram(
    "inter_token_latency_seconds",
    "Every gap between two consecutive output tokens of a choice, as the gateway sees them.",
    metrics.TOKEN_LATENCY_BUCKETS,
    ("model",),
)
TIME_PER_OUTPUT_TOKEN = metrics.histogram(
    "time_per_output_token_seconds",
    "Mean time per output token after the first, per finished choice.",
    metrics.TOKEN_LATENCY_BUCKETS,
    ("model",),
)
E2E_LATENCY = metrics.histogram(
    "e2e_request_latency_seconds",
    "Time from a request's admission at the gateway to its last token, per finished choice.",
    metrics.REQUEST_BUCKETS,
    ("model",),
)
FINISHED = metrics.counter(
    "request_success_total",
    "Choices that finished, by why they stopped (stop: EOS or a stop sequence; length).",
    ("model", "finished_reason"),
)
IN_FLIGHT = metrics.gauge(
    "requests_in_flight", "Generation requests admitted by this gateway and not yet answered."
)
RATE_LIMITED = metrics.counter(
    "rate_limit_rejections_total",
    "Requests refused with 429 because their API key was over a limit "
    "(limit: concurrent, or rate: requests or tokens per minute).",
    ("limit",),
)
ERRORS = metrics.counter(
    "request_errors_total",
    "Requests that ended in an error, by the error body's code (gRPC status names for the "
    "stack's own errors; cancelled: the client went away).",
    ("code",),
)

# The HTTP status of each of the stack's errors names its status code one-to-one (errors.py).
_CODE_OF_STATUS = {
    cls.http_status: cls.rpc_code.lower()
    for cls in (
        InvalidArgument,
        Unauthenticated,
        NotFound,
        ResourceExhausted,
        Cancelled,
        Internal,
        Unavailable,
        DeadlineExceeded,
    )
}


# Every known label value exists from the start, at 0: a panel shows 0, not "no data".
for _code in _CODE_OF_STATUS.values():
    ERRORS.labels(code=_code)
for _limit in ("concurrent", "rate"):
    RATE_LIMITED.labels(limit=_limit)


def error_code(error: BaseException) -> str:
    if isinstance(error, LayerserveError):
        return error.rpc_code.lower()
    return "internal"


def count_error(code: str) -> None:
    ERRORS.labels(code=code).inc()


def status_code(status: int) -> str:
    """The code an error response of this status carries: the stack's own errors map to gRPC
    codes; aiohttp's (no route, wrong method, body too large) to their reason phrase, as their
    error bodies say (http_json.http_exception_response)."""
    if status in _CODE_OF_STATUS:
        return _CODE_OF_STATUS[status]
    try:
        return HTTPStatus(status).phrase.lower().replace(" ", "_")
    except ValueError:
        return str(status)


def error_counter(skip: frozenset[str]) -> Callable:
    """Middleware counting every error response, and every request whose client went away
    before the answer (its handler cancelled), except on the paths in `skip` (probes, the
    API document, /metrics). Place it outside the middleware that turns errors into
    responses."""

    @web.middleware
    async def count_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in skip:
            return await handler(request)
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            count_error("cancelled")
            raise
        if response.status >= 400:
            count_error(status_code(response.status))
        return response

    return count_errors


async def serve_metrics(request: web.Request) -> web.Response:
    """GET /metrics: this process's metrics, in OpenMetrics (with exemplars) when the scraper
    asks for it, else in the Prometheus text format."""
    body, content_type = render(request.headers.get("Accept"))
    return web.Response(body=body, headers={"Content-Type": content_type})


class ChoiceTimer:
    """Times one choice from `started` (time.monotonic()) through the deltas it produces;
    `trace_context`: the request's W3C carrier (its trace id goes into exemplars)."""

    __slots__ = ("_started", "_model", "_first", "_last", "_exemplar")

    def __init__(self, started: float, model: str, trace_context: dict[str, str] | None = None):
        self._started = started
        self._model = model
        self._first: float | None = None
        self._last: float | None = None
        trace_id = tracing.sampled_trace_id(trace_context or {})
        self._exemplar = {"trace_id": trace_id} if trace_id is not None else None

    def add(self, delta: GenerationDelta) -> None:
        now = time.monotonic()
        model = delta.model or self._model
        if delta.token_ids:
            self._tokens(model, len(delta.token_ids), now)
        if delta.finish_reason is None:
            return
        E2E_LATENCY.labels(model).observe(now - self._started, self._exemplar)
        FINISHED.labels(model, delta.finish_reason).inc()
        if self._first is not None and delta.completion_tokens > 1:
            per_token = (now - self._first) / (delta.completion_tokens - 1)
            TIME_PER_OUTPUT_TOKEN.labels(model).observe(per_token)

    def _tokens(self, model: str, count: int, now: float) -> None:
        """`count` tokens arrived at `now`: the first one's TTFT, then one gap per token."""
        itl = INTER_TOKEN_LATENCY.labels(model)
        if self._last is None:
            self._first = now
            TIME_TO_FIRST_TOKEN.labels(model).observe(now - self._started, self._exemplar)
            gaps, gap = count - 1, 0.0  # the rest came with the first one
        else:
            gaps, gap = count, (now - self._last) / count
        for _ in range(gaps):
            itl.observe(gap, self._exemplar)
        self._last = now
