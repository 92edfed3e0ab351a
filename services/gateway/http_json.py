"""JSON bodies of the HTTP front end: compact encoding, SSE framing, OpenAI error bodies."""

from __future__ import annotations

import json
import re
from typing import Any

from aiohttp import web

from services.common.errors import LayerserveError, openai_error_body

SSE_DONE = b"data: [DONE]\n\n"
_SURROGATE = re.compile("[\ud800-\udfff]")
GENERIC_MESSAGE = "internal server error"


def dumps(obj: Any) -> bytes:
    """Compact and without \\u escapes: smaller chunks, and the fastest json.dumps path.
    A lone surrogate from a broken detokenizer becomes '?' rather than failing the response."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return text.encode("utf-8", "replace")


def has_lone_surrogate(obj: Any) -> bool:
    """Whether a parsed JSON value holds, in any key or string, half a UTF-16 surrogate pair.
    Walks with its own stack: a body nested as deep as json.loads allows must not recurse."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def sse_event(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def named_sse_event(event: dict[str, Any]) -> bytes:
    """An SSE event named by its own "type" (the Responses and Anthropic Messages streams)."""
    return b"event: " + event["type"].encode() + b"\ndata: " + dumps(event) + b"\n\n"


def json_response(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=dumps(obj), status=status, content_type="application/json")


def error_body(
    message: str, *, type_: str, code: str | None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's ErrorResponse, for failures that are not LayerserveErrors."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_payload(error: BaseException) -> dict[str, Any]:
    """What the client may see of an error: a LayerserveError's own message, else nothing."""
    if isinstance(error, LayerserveError):
        return openai_error_body(error)
    return error_body(GENERIC_MESSAGE, type_="server_error", code="internal")


def error_response(error: BaseException) -> web.Response:
    status = error.http_status if isinstance(error, LayerserveError) else 500
    response = json_response(error_payload(error), status=status)
    retry_after = getattr(error, "retry_after", None)
    if retry_after is not None:  # 429 and 503: tell the client when trying again makes sense
        response.headers["Retry-After"] = str(retry_after)
    return response


def http_exception_response(exc: web.HTTPException) -> web.Response:
    """aiohttp's own 4xx/5xx (no route, wrong method, body too large) as OpenAI error bodies."""
    if isinstance(exc, web.HTTPNotFound):
        message = "no such endpoint"
    elif isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = ", ".join(sorted(exc.allowed_methods))
        message = f"method {exc.method} is not allowed here; allowed: {allowed}"
    elif isinstance(
        exc, web.HTTPRequestEntityTooLarge | web.HTTPUnsupportedMediaType | web.HTTPRequestTimeout
    ):
        message = exc.text or exc.reason  # "Maximum request body size N exceeded, ..."
    else:
        message = exc.reason
    code = exc.reason.lower().replace(" ", "_")
    type_ = "invalid_request_error" if exc.status < 500 else "server_error"
    response = json_response(error_body(message, type_=type_, code=code), status=exc.status)
    if isinstance(exc, web.HTTPMethodNotAllowed):
        response.headers["Allow"] = exc.headers["Allow"]
    return response
