"""Anthropic's error shape on the Anthropic Messages API's paths.

Errors are made in one place for the whole gateway (http_app's error middleware, as OpenAI
ErrorResponse bodies); on /v1/messages and /v1/messages/count_tokens this middleware, outside
that one, rewrites them as Anthropic's SDK expects them:

    {"type": "error", "error": {"type": "invalid_request_error", "message": "..."}}

with the error type Anthropic gives each HTTP status. Status, headers (Retry-After,
X-Request-Id) and message stay as they were.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

ANTHROPIC_PATHS = frozenset({"/v1/messages", "/v1/messages/count_tokens"})

# Anthropic's error types by HTTP status; 5xx not listed are api_error.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    kind = _TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


@web.middleware
async def anthropic_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await handler(request)
    if request.path not in ANTHROPIC_PATHS or response.status < 400:
        return response
    if not isinstance(response, web.Response) or not isinstance(response.body, bytes):
        return response
    try:
        message = json.loads(response.body)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response  # not an error body of ours: left alone
    response.body = json.dumps(anthropic_error_body(response.status, message)).encode()
    return response
