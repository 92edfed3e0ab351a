"""The Anthropic Messages API's routes: POST /v1/messages and /v1/messages/count_tokens, and
the key its SDK sends (`x-api-key`). Errors on these paths take Anthropic's shape
(anthropic_errors.py)."""

from __future__ import annotations

from aiohttp import web

from services.gateway.anthropic_errors import ANTHROPIC_PATHS
from services.gateway.anthropic_request import parse_count_tokens, parse_messages_request
from services.gateway.api_context import ApiAdapter, ApiContext


def add_anthropic_routes(app: web.Application, api: ApiAdapter) -> None:
    app.router.add_post("/v1/messages", api(_messages))
    app.router.add_post("/v1/messages/count_tokens", api(_count_tokens))


def authorization(request: web.Request) -> str | None:
    """The Authorization header; on the Anthropic API, its SDK's x-api-key header as well."""
    given = request.headers.get("Authorization")
    if given is None and request.path in ANTHROPIC_PATHS and "x-api-key" in request.headers:
        return f"Bearer {request.headers['x-api-key']}"
    return given


async def _messages(request: web.Request, api: ApiContext) -> web.StreamResponse:
    body = await api.read_body()
    parsed, renderer = parse_messages_request(body, api.request_id, api.trace_context, api.limits)
    return await api.serve(parsed, renderer)


async def _count_tokens(request: web.Request, api: ApiContext) -> web.StreamResponse:
    body = await api.read_body()
    parsed, renderer = parse_count_tokens(body, api.request_id, api.trace_context, api.limits)
    return await api.serve(parsed, renderer)
