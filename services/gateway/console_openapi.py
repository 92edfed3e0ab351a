"""The web console's routes (console_routes.py) in the gateway's OpenAPI document: the page and
its assets, public; the JSON it reads, behind the API's keys."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_REQUEST_ID = {"X-Request-Id": {"required": True, "schema": {"type": "string"}}}
_OBJECT = {"type": "object"}


def console_paths() -> Schema:
    """paths entries."""
    trace_id = {"name": "trace_id", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "/": {"get": _file("consolePage", "text/html", "The console's page.")},
        "/console/console.js": {"get": _file("consoleScript", "text/javascript", "Its script.")},
        "/console/timeline.js": {"get": _file("consoleTimeline", "text/javascript", "Timeline.")},
        "/console/console.css": {"get": _file("consoleStyle", "text/css", "Its style sheet.")},
        "/console/session.json": {
            "get": {
                "operationId": "consoleSession",
                "security": [],
                "responses": {"200": _json("Whether the stack wants an API key.")},
            }
        },
        "/console/api/info": {"get": _api("consoleInfo", "Where traces go; prompts shown.")},
        "/console/api/stack": {"get": _api("consoleStack", "Models, workers, their load now.")},
        "/console/api/traces": {"get": _api("consoleTraces", "The caller's last requests.")},
        "/console/api/traces/{trace_id}": {
            "get": {
                **_api("consoleTrace", "One of the caller's requests, every span.", ("404",)),
                "parameters": [trace_id],
            }
        },
    }


def _file(operation_id: str, media_type: str, description: str) -> Schema:
    ok = {
        "description": description,
        "headers": dict(_REQUEST_ID),
        "content": {media_type: {"schema": {"type": "string"}}},
    }
    return {"operationId": operation_id, "security": [], "responses": {"200": ok}}


def _json(description: str) -> Schema:
    return {
        "description": description,
        "headers": dict(_REQUEST_ID),
        "content": {"application/json": {"schema": _OBJECT}},
    }


def _api(operation_id: str, description: str, errors: tuple[str, ...] = ()) -> Schema:
    statuses = {"401": "Unauthorized", "404": "NotFound", "503": "Unavailable"}
    refs = {s: {"$ref": f"#/components/responses/{statuses[s]}"} for s in ("401", *errors, "503")}
    return {"operationId": operation_id, "responses": {"200": _json(description), **refs}}
