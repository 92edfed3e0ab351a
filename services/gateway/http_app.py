"""The gateway's OpenAI-compatible HTTP front end, as an aiohttp application.

Routes: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id},
GET /health. Every response carries X-Request-Id (the client's, when it sent a sane one), and
every log line about a request names it. Errors are OpenAI ErrorResponse bodies: a
LayerserveError with its own status, anything else a generic 500 whose traceback goes only to
the log.

Serve it with handler cancellation on (`web.AppRunner(app, handler_cancellation=True)`):
aiohttp then cancels the handler when the client disconnects, which closes the backend
iterators and aborts generation even while no bytes are being written.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from services.common.errors import LayerserveError, NotFound
from services.gateway.api_keys import is_authorized, tenant_id
from services.gateway.backend import Backend, ModelCard
from services.gateway.http_generation import respond_full, respond_stream
from services.gateway.http_json import (
    error_body,
    error_response,
    http_exception_response,
    json_response,
)
from services.gateway.openai_protocol import (
    ParsedRequest,
    parse_chat_request,
    parse_completion_request,
    parse_json_body,
)

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Parser = Callable[[dict, dict[str, str]], ParsedRequest]

BACKEND = web.AppKey("backend", Backend)
API_KEYS = web.AppKey("api_keys", frozenset)
REQUEST_ID = web.RequestKey("request_id", str)
REQUEST_ID_HEADER = "X-Request-Id"
# Long prompts and token-id lists outgrow aiohttp's 1 MiB default body limit.
MAX_BODY_BYTES = 32 * 1024 * 1024
# An echoed id lands in headers and logs, so only short, plain ones are taken from the client.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
_TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context, forwarded to the stack
_UNAUTHENTICATED_PATHS = frozenset({"/health"})  # probes carry no key


def create_app(backend: Backend, *, api_keys: frozenset[str] | None) -> web.Application:
    """api_keys None or empty: no authentication. Otherwise `Authorization: Bearer <key>`."""
    app = web.Application(
        middlewares=[_request_id_middleware, _error_middleware, _auth_middleware],
        client_max_size=MAX_BODY_BYTES,
    )
    app[BACKEND] = backend
    app[API_KEYS] = frozenset(api_keys or ())
    app.on_response_prepare.append(_add_request_id_header)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_get("/v1/models", _list_models)
    app.router.add_get("/v1/models/{model:.+}", _get_model)
    app.router.add_get("/health", _health)
    return app


@web.middleware
async def _request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    given = request.headers.get(REQUEST_ID_HEADER, "")
    request[REQUEST_ID] = given if _SAFE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex
    return await handler(request)


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
        log.log(level, "request %s: %s: %s", request[REQUEST_ID], type(err).__name__, err.message)
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
    keys = request.app[API_KEYS]
    if not keys or request.path in _UNAUTHENTICATED_PATHS:
        return await handler(request)
    authorization = request.headers.get("Authorization")
    if not authorization:
        return _unauthorized("missing API key: send 'Authorization: Bearer <key>'")
    # Keys are ASCII; hmac.compare_digest refuses to compare a non-ASCII str at all.
    if not authorization.isascii() or not is_authorized(keys, authorization):
        return _unauthorized("incorrect API key provided")
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
    parsed = parse(parse_json_body(await request.read()), _trace_context(request))
    if request.app[API_KEYS]:
        tenant = tenant_id(request.headers.get("Authorization"))
        for generation in parsed.requests:
            generation.tenant = tenant
    backend = request.app[BACKEND]
    log.debug(
        "request %s: %s model=%s n=%d stream=%s",
        request[REQUEST_ID],
        parsed.response_id,
        parsed.model,
        len(parsed.requests),
        parsed.stream,
    )
    if parsed.stream:
        return await respond_stream(request, request[REQUEST_ID], backend, parsed)
    return await respond_full(backend, parsed)


def _trace_context(request: web.Request) -> dict[str, str]:
    return {name: request.headers[name] for name in _TRACE_HEADERS if name in request.headers}


async def _list_models(request: web.Request) -> web.Response:
    cards = await request.app[BACKEND].list_models()
    return json_response({"object": "list", "data": [_model_json(card) for card in cards]})


async def _get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model"]
    for card in await request.app[BACKEND].list_models():
        if card.id == model_id:
            return json_response(_model_json(card))
    raise NotFound(f"model {model_id!r} does not exist", param="model")


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
    return json_response({"status": "ok"})
