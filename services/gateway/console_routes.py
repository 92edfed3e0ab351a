"""The web console (issue 31): static files from services/gateway/console/ at `/`, and the JSON
the page reads, behind the API's keys:

- GET /console/api/traces: the caller's last requests (newest first), from the TraceRing;
- GET /console/api/traces/{trace_id}: one of them with all its spans, from every service;
- GET /console/api/stack: the stack now (stack_panel.py);
- GET /console/api/info: where traces go and whether prompts are shown.

The page itself and its assets carry no key (PAGE_PATHS): it asks for one when /v1/models
answers 401 (`session.json` says whether the stack has keys), and keeps it in sessionStorage.
A middleware files the trace of each traced request under the key that sent it, so that a key
sees only its own; the request's prompt is kept with it only when LAYERSERVE_LOG_PROMPTS=1.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from opentelemetry import trace

from services.common.env import env_list, env_str
from services.common.errors import NotFound
from services.gateway.api_keys import ApiKey
from services.gateway.front_door import FrontDoor
from services.gateway.stack_panel import StackPanel
from services.gateway.trace_receiver import start_receiver
from services.gateway.trace_ring import MAX_VALUE_CHARS, TraceOwner, TraceRing

log = logging.getLogger(__name__)

CONSOLE_DIR = Path(__file__).parent / "console"
_ASSETS = {
    "console.js": "text/javascript",
    "console.css": "text/css",
    "timeline.js": "text/javascript",
}
PAGE_PATHS = frozenset({"/", "/console/session.json", *(f"/console/{name}" for name in _ASSETS)})
RING = web.AppKey("console_ring", TraceRing)
PANEL = web.AppKey("console_panel", StackPanel)
_KEYS = web.AppKey("console_keys", object)
_OWNER = web.RequestKey("console_owner", TraceOwner)
_TRUE = ("1", "true", "yes")


def add_console_routes(
    app: web.Application,
    caller: web.RequestKey[ApiKey],
    request_id: web.RequestKey[str],
    front_door: web.AppKey[FrontDoor],
) -> None:
    """The console's routes, its trace ring and receiver (when LAYERSERVE_TRACE_RECEIVER names
    one), and the middleware that claims traces; call before the app starts. The keys are where
    http_app keeps the caller, the request id the client sees, and the front door."""
    app[RING] = TraceRing()
    app[PANEL] = StackPanel(env_list("SCHEDULER_ADDRESS"))
    app[_KEYS] = _Keys(caller, request_id, front_door)
    app.middlewares.append(_claim_trace)  # innermost: the caller is known, the span current
    app.on_startup.append(_start_receiver)
    app.on_response_prepare.append(_name_owner)
    app.router.add_get("/", _index)
    app.router.add_get("/console/session.json", _session)
    app.router.add_get("/console/api/info", _info)
    app.router.add_get("/console/api/stack", _stack)
    app.router.add_get("/console/api/traces", _traces)
    app.router.add_get("/console/api/traces/{trace_id}", _trace)
    for name in _ASSETS:
        app.router.add_get(f"/console/{name}", _asset)


@dataclass(frozen=True)
class _Keys:
    caller: web.RequestKey[ApiKey]
    request_id: web.RequestKey[str]
    front_door: web.AppKey[FrontDoor]


def _tenant(request: web.Request) -> str:
    return request[request.app[_KEYS].caller].tenant


async def _start_receiver(app: web.Application) -> None:
    address = env_str("TRACE_RECEIVER", "")
    if address:
        start_receiver(address, app[RING])


@web.middleware
async def _claim_trace(request: web.Request, handler) -> web.StreamResponse:
    context = trace.get_current_span().get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):  # no spans will come
        return await handler(request)
    keys: _Keys = request.app[_KEYS]  # type: ignore[assignment]
    owner = request[_OWNER] = TraceOwner(_tenant(request), request[keys.request_id], request.path)
    request.app[RING].claim(trace.format_trace_id(context.trace_id), owner)
    try:
        return await handler(request)
    finally:
        owner.done = True
        owner.request_id = request[keys.request_id]
        if _log_prompts():
            owner.prompt = await _prompt_of(request)


async def _name_owner(request: web.Request, response: web.StreamResponse) -> None:
    """The id the client sees is final once the answer starts (a stream's first bytes)."""
    owner = request.get(_OWNER)
    if owner is not None:
        keys: _Keys = request.app[_KEYS]  # type: ignore[assignment]
        owner.request_id = request[keys.request_id]


async def _index(request: web.Request) -> web.FileResponse:
    return _file("index.html", "text/html")


async def _asset(request: web.Request) -> web.FileResponse:
    name = request.path.rsplit("/", 1)[1]
    return _file(name, _ASSETS[name])


def _file(name: str, content_type: str) -> web.FileResponse:
    response = web.FileResponse(CONSOLE_DIR / name)
    response.content_type = content_type
    response.headers["Cache-Control"] = "no-cache"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"
    )
    return response


async def _session(request: web.Request) -> web.Response:
    keys: _Keys = request.app[_KEYS]  # type: ignore[assignment]
    return web.json_response({"keys_required": request.app[keys.front_door].keys.enabled})


async def _info(request: web.Request) -> web.Response:
    endpoint = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT", ""
    )
    if endpoint:
        traces = f"sent to the OTLP collector at {endpoint}: open them there"
    elif env_str("TRACE_RECEIVER", ""):
        traces = "kept here, the last ones in memory"
    else:
        traces = "off: set LAYERSERVE_TRACE_RECEIVER (make run does) or an OTLP endpoint"
    name = request[request.app[_KEYS].caller].name  # type: ignore[attr-defined]
    return web.json_response(
        {"key": name, "traces": traces, "ring": not endpoint, "prompts": _log_prompts()}
    )


async def _stack(request: web.Request) -> web.Response:
    """The stack now, as far as the caller's key may see it: the models it may use, and its own
    requests in flight."""
    caller: ApiKey = request[request.app[_KEYS].caller]  # type: ignore[attr-defined]
    snapshot = await request.app[PANEL].snapshot(caller.may_use)
    snapshot["yours"] = request.app[RING].in_flight(caller.tenant)
    return web.json_response(snapshot)


async def _traces(request: web.Request) -> web.Response:
    return web.json_response({"data": request.app[RING].recent(_tenant(request))})


async def _trace(request: web.Request) -> web.Response:
    found = request.app[RING].trace(request.match_info["trace_id"], _tenant(request))
    if found is None:  # the same for another key's trace as for none: ids are not to be probed
        raise NotFound("no such trace (or it has left the console's ring)")
    return web.json_response(found)


def _log_prompts() -> bool:
    return env_str("LOG_PROMPTS", "").lower() in _TRUE


async def _prompt_of(request: web.Request) -> str:
    """The last user turn (or the prompt) of a request's JSON body, cut short."""
    try:
        body = json.loads(await request.read())
    except Exception:  # a body the handler refused already: nothing to show
        return ""
    if not isinstance(body, dict):
        return ""
    text = body.get("prompt") or body.get("input") or ""
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "user":
            text = message.get("content", "")
    return (text if isinstance(text, str) else json.dumps(text))[:MAX_VALUE_CHARS]
