"""The gateway's OpenAI-compatible HTTP front end, as an aiohttp application.

Routes: POST /v1/completions and /v1/chat/completions, the Responses, Anthropic Messages and
embeddings APIs (responses_routes.py, anthropic_routes.py, embeddings_routes.py), GET
/v1/models[/{id}], /v1/usage (the caller's own counters), /health (liveness), /ready
(lifecycle.py), /metrics (request_metrics.py). Who may come in, and how many at once, is the
FrontDoor's business (front_door.py). Every response carries X-Request-Id (the client's, when it
sent a sane one), and every log line about a request names it. Errors are OpenAI ErrorResponse
bodies: a LayerserveError with its own status, anything else a 500 (its traceback in the log).

Serve it with handler cancellation on (`web.AppRunner(app, handler_cancellation=True)`):
aiohttp then cancels the handler when the client disconnects, which closes the backend
iterators and aborts generation even while no bytes are being written.
"""

from __future__ import annotations

import functools
import logging
import re
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from services.common import tracing
from services.common.errors import LayerserveError, NotFound, Unauthenticated, Unavailable
from services.gateway import request_span
from services.gateway.anthropic_errors import anthropic_errors
from services.gateway.anthropic_routes import add_anthropic_routes, authorization
from services.gateway.api_context import API_GENERATION_PATHS, ApiContext, ApiHandler
from services.gateway.api_keys import ApiKey, KeyRing
from services.gateway.backend import Backend, ModelCard
from services.gateway.console_routes import PAGE_PATHS, add_console_routes
from services.gateway.embeddings_routes import add_embeddings_routes
from services.gateway.front_door import FrontDoor
from services.gateway.grammar_check import check_grammars
from services.gateway.http_body import connection_options, read_body
from services.gateway.http_generation import ChunkRenderer, Renderer, respond_full, respond_stream
from services.gateway.http_json import (
    error_body,
    error_response,
    http_exception_response,
    json_response,
)
from services.gateway.json_body import parse_object_off_loop
from services.gateway.lifecycle import LIFECYCLE, Lifecycle
from services.gateway.log_text import excerpt, log_safe
from services.gateway.openai_protocol import (
    ParsedRequest,
    parse_chat_request,
    parse_completion_request,
)
from services.gateway.openapi import openapi_handler
from services.gateway.prompt_guard import PromptGuard
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from services.gateway.request_metrics import error_counter, serve_metrics
from services.gateway.request_validator import check_model_name
from services.gateway.responses_routes import add_responses_routes
from services.gateway.responses_store import ResponseStore

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# (body, trace context, limits, *, request_id): openai_protocol's parse_*_request.
Parser = Callable[..., ParsedRequest]

BACKEND = web.AppKey("backend", Backend)
FRONT_DOOR = web.AppKey("front_door", FrontDoor)
LIMITS = web.AppKey("limits", RequestLimits)
PROMPT_GUARD = web.AppKey("prompt_guard", PromptGuard)
# Minted once, here at the door: the response's id and its choices' ids are made from it.
OWN_ID = web.RequestKey("own_id", str)
REQUEST_ID = web.RequestKey("request_id", str)  # the client's X-Request-Id, else ours
CALLER = web.RequestKey("caller", ApiKey)
CLIENT_GAVE_ID = web.RequestKey("client_gave_id", bool)
SPAN = web.RequestKey("span", object)  # the request's span (request_span.py), when traced
REQUEST_ID_HEADER = "X-Request-Id"
# An echoed id lands in headers and logs, so only short, plain ones are taken from the client.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
# Only generation is traced: probes, listings and scrapes would bury the requests in Jaeger.
_TRACED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"}) | API_GENERATION_PATHS
# Probes carry no key; the API description is public; so are the metrics (Prometheus scrapes
# them: counts and timings, never a prompt or a key) and the console's page (it asks for one).
_UNAUTHENTICATED_PATHS = frozenset({"/health", "/ready", "/openapi.json", "/metrics", *PAGE_PATHS})


def create_app(
    backend: Backend,
    *,
    front_door: FrontDoor | None = None,
    limits: RequestLimits = DEFAULT_LIMITS,
    lifecycle: Lifecycle | None = None,
    responses: ResponseStore | None = None,
) -> web.Application:
    """front_door None: no authentication, no limits beyond `limits`. A front door with keys
    wants `Authorization: Bearer <key>` (on the Anthropic API, `x-api-key: <key>` too).
    lifecycle: readiness for /ready, and the drain (503 for new requests, a count of those in
    flight); None: always ready, never draining. responses: the Responses API's store."""
    middlewares = [
        _request_id_middleware,
        anthropic_errors,  # Anthropic's error shape on its paths, whoever answered
        _trace_middleware,  # outside _error_middleware: its span sees the final status
        error_counter(_UNAUTHENTICATED_PATHS),  # outside _error_middleware: sees its answers
        _error_middleware,
        _auth_middleware,
    ]
    if lifecycle is not None:
        middlewares.append(lifecycle.middleware)
    app = web.Application(
        middlewares=middlewares,
        client_max_size=limits.max_body_bytes,
        handler_args=connection_options(limits),  # idle and slow connections: http_body.py
    )
    if lifecycle is not None:
        app[LIFECYCLE] = lifecycle
    app[BACKEND] = backend
    app[FRONT_DOOR] = front_door or FrontDoor(KeyRing([]))
    app[LIMITS] = limits
    app[PROMPT_GUARD] = PromptGuard(backend, limits)
    app.on_response_prepare.append(_add_request_id_header)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    add_responses_routes(app, responses or ResponseStore(), _api)
    add_anthropic_routes(app, _api)
    add_embeddings_routes(app, _api)
    app.router.add_get("/v1/models", _list_models)
    app.router.add_get("/v1/models/{model:.+}", _get_model)
    app.router.add_get("/v1/usage", _usage)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/openapi.json", openapi_handler(limits))
    app.router.add_get("/metrics", serve_metrics)
    add_console_routes(app, CALLER, REQUEST_ID, FRONT_DOOR)
    return app


@web.middleware
async def _request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    given = request.headers.get(REQUEST_ID_HEADER, "")
    request[CLIENT_GAVE_ID] = bool(_SAFE_REQUEST_ID.fullmatch(given))
    request[OWN_ID] = uuid.uuid4().hex
    request[REQUEST_ID] = given if request[CLIENT_GAVE_ID] else request[OWN_ID]
    return await handler(request)


@web.middleware
async def _trace_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The request's span, current while the handler runs: the front door's checks and the
    choices' spans are its children."""
    if request.path not in _TRACED_PATHS or not tracing.enabled():
        return await handler(request)
    span = request_span.start_http(request.method, request.path, request.headers)
    request[SPAN] = span
    status = None
    try:
        with tracing.use(span):
            response = await handler(request)
        status = response.status
        return response
    finally:
        request_span.end_http(span, status, request[REQUEST_ID])


async def _add_request_id_header(request: web.Request, response: web.StreamResponse) -> None:
    """A prepare hook rather than the middleware: SSE responses send headers mid-handler."""
    request_id = request.get(REQUEST_ID)
    if request_id is not None:
        response.headers[REQUEST_ID_HEADER] = request_id


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except LayerserveError as err:
        level = logging.WARNING if err.http_status >= 500 else logging.INFO  # ours, not theirs
        name = type(err).__name__
        log.log(level, "request %s: %s: %s", request[REQUEST_ID], name, log_safe(err.message))
        return error_response(err)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return http_exception_response(exc)
    except Exception as exc:
        log.exception("request %s: unexpected error", request[REQUEST_ID])
        return error_response(exc)


@web.middleware
async def _auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in _UNAUTHENTICATED_PATHS:
        return await handler(request)
    try:
        request[CALLER] = request.app[FRONT_DOOR].authenticate(authorization(request))
    except Unauthenticated as err:
        return _unauthorized(err.message)
    return await handler(request)


def _unauthorized(message: str) -> web.Response:
    body = error_body(message, type_="invalid_request_error", code="invalid_api_key")
    response = json_response(body, status=401)
    response.headers["WWW-Authenticate"] = "Bearer"
    return response


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_completion_request)


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, parse_chat_request)


async def _generate(request: web.Request, parse: Parser) -> web.StreamResponse:
    body = await _json_body(request)
    limits = request.app[LIMITS]
    parsed = parse(body, _trace_context(request), limits, request_id=request[OWN_ID])
    return await _serve(request, parsed, ChunkRenderer(parsed))


def _api(handler: ApiHandler) -> Handler:
    """A Responses or Anthropic API handler, given what it needs of this app (api_context.py)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        context = ApiContext(
            request[OWN_ID],
            request[CALLER].tenant,
            request.app[LIMITS],
            _trace_context(request),
            functools.partial(_json_body, request),
            functools.partial(_serve, request),
        )
        return await handler(request, context)

    return handle


async def _json_body(request: web.Request) -> dict:
    _require_json(request)
    # Read within the body timeout, inflated here (never by aiohttp): http_body.py.
    return await parse_object_off_loop(await read_body(request, request.app[LIMITS]))


async def _serve(
    request: web.Request, parsed: ParsedRequest, renderer: Renderer
) -> web.StreamResponse:
    """Admits a parsed request and answers it, whole or streamed, in the renderer's shapes."""
    limits = request.app[LIMITS]
    if not request[CLIENT_GAVE_ID]:
        # Our own id is the response id, which prefixes the id of every choice in the other
        # services' logs: one grep finds the request everywhere.
        request[REQUEST_ID] = parsed.response_id
    await request.app[PROMPT_GUARD].check(parsed.requests[0])  # the choices share the prompt
    request_span.describe(request.get(SPAN), parsed.response_id, parsed.requests)
    caller = request[CALLER]
    door = request.app[FRONT_DOOR]
    async with door.admit(caller, parsed.model, request.app[BACKEND], parsed.requests) as backend:
        await check_grammars(parsed.requests[0])  # the choices share them; off the event loop
        log.debug(
            "request %s: %s key=%s model=%s n=%d stream=%s",
            request[REQUEST_ID],
            parsed.response_id,
            caller.name,
            parsed.model,
            len(parsed.requests),
            parsed.stream,
        )
        if parsed.stream:
            stall = limits.stalled_client_seconds
            response = await respond_stream(
                request, request[REQUEST_ID], backend, parsed, stall, renderer
            )
        else:
            response = await respond_full(backend, parsed, renderer)
        request_span.settle(request.get(SPAN), getattr(backend, "tally", None))
        return response


def _require_json(request: web.Request) -> None:
    """A body that says it is something else (text/plain, a form) is refused, not guessed at:
    415. A request without any Content-Type is read as JSON."""
    if "Content-Type" not in request.headers:
        return
    kind = request.content_type  # the media type, lowercased, without parameters
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return
    raise web.HTTPUnsupportedMediaType(
        text=f"Content-Type must be application/json, not {excerpt(kind)}"
    )


def _trace_context(request: web.Request) -> dict[str, str]:
    """What the choices continue: the request's span, or (not traced here) the client's."""
    return tracing.forward(request.get(SPAN), request_span.client_context(request.headers))


async def _list_models(request: web.Request) -> web.Response:
    cards = await _visible_models(request)
    return json_response({"object": "list", "data": [_model_json(card) for card in cards]})


async def _get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model"]
    check_model_name(model_id)  # a 400 that quotes no more than an excerpt of it
    for card in await _visible_models(request):
        if card.id == model_id:
            return json_response(_model_json(card))
    raise NotFound(
        f"The model {model_id!r} does not exist or you do not have access to it.", param="model"
    )


async def _visible_models(request: web.Request) -> list[ModelCard]:
    """The models the caller's key may use."""
    cards = await request.app[BACKEND].list_models()
    return request.app[FRONT_DOOR].visible_models(request[CALLER], cards)


async def _usage(request: web.Request) -> web.Response:
    caller = request[CALLER]
    usage, scope = await request.app[FRONT_DOOR].ledger.totals(caller.tenant)
    return json_response({"object": "usage", "key": caller.name, "scope": scope, **usage.as_dict()})


def _model_json(card: ModelCard) -> dict:
    # max_model_len is vLLM's extension; clients use it to size prompts.
    return {
        "id": card.id,
        "object": "model",
        "created": card.created,
        "owned_by": card.owned_by,
        "max_model_len": card.max_model_len,
    }


async def _health(request: web.Request) -> web.Response:
    """Liveness: 200 while the process serves HTTP, draining or not."""
    return json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    """Readiness: 200 once the tokenizer service (hence the scheduler and a worker) serves;
    else 503 naming what is not ready. An app without a Lifecycle has nothing to wait for."""
    lifecycle = request.app.get(LIFECYCLE)
    problem = await lifecycle.problem() if lifecycle is not None else None
    if problem is not None:  # answered here: probes must not fill the log with warnings
        return error_response(Unavailable(problem))
    return json_response({"status": "ready"})
