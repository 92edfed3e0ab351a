"""What the HTTP app gives the handlers of the Responses and Anthropic Messages APIs.

Those handlers live beside their APIs (responses_routes.py, anthropic_routes.py); through an
ApiContext their requests take the same path as chat completions: the body's checks, the
caller's key, the front door's admission, the spans and the metrics (http_app.py builds it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from services.gateway.anthropic_errors import ANTHROPIC_PATHS
from services.gateway.http_generation import Renderer
from services.gateway.openai_protocol import ParsedRequest
from services.gateway.request_limits import RequestLimits

# The routes that generate, traced as chat completions are.
API_GENERATION_PATHS = frozenset({"/v1/responses", "/v1/embeddings", *ANTHROPIC_PATHS})


@dataclass(frozen=True, slots=True)
class ApiContext:
    request_id: str  # minted at the door: the response's id is made from it
    tenant: str  # the caller's API key, by its non-secret id ("" without keys)
    limits: RequestLimits
    trace_context: dict[str, str]  # what the request's choices continue
    read_body: Callable[[], Awaitable[dict[str, Any]]]  # the JSON body (415/400 if it is not)
    # Admits a parsed request and answers it, whole or streamed, in the renderer's shapes.
    serve: Callable[[ParsedRequest, Renderer], Awaitable[web.StreamResponse]]


ApiHandler = Callable[[web.Request, ApiContext], Awaitable[web.StreamResponse]]
# Turns an ApiHandler into an aiohttp handler (http_app.py's `_api`).
ApiAdapter = Callable[[ApiHandler], Callable[[web.Request], Awaitable[web.StreamResponse]]]
