"""The gateway's OpenAPI 3.1 document, served unauthenticated at GET /openapi.json.

It describes the endpoints http_app.py really serves, the request fields it really reads with
the bounds it enforces (openapi_requests.py, from the operator's RequestLimits), the bodies it
answers (openapi_schemas.py), and the error statuses it returns, each an OpenAI ErrorResponse.
Self-contained: every $ref points inside the document.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from services.gateway.console_openapi import console_paths
from services.gateway.embeddings_openapi import embeddings_operation, embeddings_schemas
from services.gateway.http_json import dumps
from services.gateway.openapi_requests import chat_message, chat_request, completion_request
from services.gateway.openapi_schemas import response_schemas
from services.gateway.request_limits import RequestLimits
from services.gateway.responses_openapi import api_paths, api_schemas

Schema = dict[str, Any]

_ERRORS = {
    "400": ("BadRequest", "The request is malformed or asks for what the model cannot do."),
    "401": ("Unauthorized", "Missing or incorrect API key."),
    "404": ("NotFound", "No such model, or the key may not use it."),
    "413": ("PayloadTooLarge", "The request body exceeds the gateway's limit."),
    "429": ("RateLimited", "The key is over its concurrency or rate limit; see Retry-After."),
    "503": ("Unavailable", "Full, draining, or no worker ready; see Retry-After."),
    "504": ("Timeout", "The request waited in the scheduler's queue too long."),
}
_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer"}, "description": "Seconds."}}
_REQUEST_ID = {
    "X-Request-Id": {
        "required": True,
        "schema": {"type": "string"},
        "description": "The client's own X-Request-Id when it sent a plain one, else new.",
    }
}
_GENERATION_ERRORS = ("400", "401", "404", "413", "429", "503", "504")


def openapi_document(limits: RequestLimits) -> Schema:
    schemas = {
        "CreateCompletionRequest": completion_request(limits),
        "CreateChatCompletionRequest": chat_request(limits),
        "ChatMessage": chat_message(),
        **response_schemas(),
        **api_schemas(),  # the Responses and Anthropic Messages APIs
        **embeddings_schemas(),
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "layerserve",
            "version": "1",
            "description": "OpenAI-compatible text generation. Unknown request fields are "
            "ignored; known OpenAI features the stack lacks are refused with 400.",
        },
        "security": [{"bearer": []}],
        "paths": _paths(limits),
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
            "schemas": schemas,
            "responses": _error_responses(limits),
        },
    }


def openapi_handler(limits: RequestLimits) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The GET /openapi.json handler; the document is built once."""
    body = dumps(openapi_document(limits))

    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return serve


def _paths(limits: RequestLimits) -> Schema:
    model_param = {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}
    return {
        "/v1/completions": {
            "post": _generation("createCompletion", "CreateCompletionRequest", "Completion")
        },
        "/v1/chat/completions": {
            "post": _generation("createChatCompletion", "CreateChatCompletionRequest", "Chat")
        },
        "/v1/embeddings": {
            "post": embeddings_operation(_error_refs(_GENERATION_ERRORS), dict(_REQUEST_ID))
        },
        "/v1/models": {"get": _get("listModels", "ListModelsResponse", ("401", "503"))},
        "/v1/models/{model}": {
            "get": {
                **_get("retrieveModel", "Model", ("400", "401", "404", "503")),
                "parameters": [model_param],
            }
        },
        "/v1/usage": {"get": _get("getUsage", "Usage", ("401", "503"))},
        "/health": {"get": _get("health", "Status", (), public=True)},
        "/ready": {"get": _ready()},
        "/openapi.json": {
            "get": {
                "operationId": "openapi",
                "security": [],
                "responses": {
                    "200": _json("This document.", {"type": "object"}),
                    **_error_refs(("503",)),
                },
            }
        },
        "/metrics": {"get": _metrics()},
        **api_paths(),
        **console_paths(),
    }


def _generation(operation_id: str, request_schema: str, kind: str) -> Schema:
    response = (
        "CreateCompletionResponse" if kind == "Completion" else "CreateChatCompletionResponse"
    )
    ok = _json(f"The whole {kind.lower()} (stream false or absent).", _ref(response))
    # Before OpenAPI 3.2, an event stream's schema describes each event.
    ok["content"]["text/event-stream"] = {
        "schema": {
            "type": "object",
            "required": ["data"],
            "properties": {"data": {"type": "string"}},
            "description": f"stream true: events whose data is a {response} chunk (JSON), "
            "the last one `[DONE]`; an error after the first event arrives as an event whose "
            "data is an ErrorResponse, and ends the stream.",
        }
    }
    return {
        "operationId": operation_id,
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref(request_schema)}},
        },
        "responses": {"200": ok, **_error_refs(_GENERATION_ERRORS)},
    }


def _get(operation_id: str, schema: str, errors: tuple[str, ...], public: bool = False) -> Schema:
    responses = {"200": _json("OK", _ref(schema)), **_error_refs(errors)}
    operation: Schema = {"operationId": operation_id, "responses": responses}
    if public:
        operation["security"] = []  # probes carry no key
    return operation


def _ready() -> Schema:
    operation = _get("ready", "Status", ("503",), public=True)
    operation["description"] = (
        "200 once the stack behind the gateway serves; 503 (naming what is not ready) before "
        "that and while the gateway drains."
    )
    return operation


def _metrics() -> Schema:
    ok = {
        "description": "The gateway's metrics in the Prometheus text format (`layerserve:*`).",
        "headers": dict(_REQUEST_ID),
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    return {"operationId": "metrics", "security": [], "responses": {"200": ok}}


def _json(description: str, schema: Schema) -> Schema:
    return {
        "description": description,
        "headers": dict(_REQUEST_ID),
        "content": {"application/json": {"schema": schema}},
    }


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _error_refs(statuses: tuple[str, ...]) -> Schema:
    return {status: {"$ref": f"#/components/responses/{_ERRORS[status][0]}"} for status in statuses}


def _error_responses(limits: RequestLimits) -> Schema:
    responses = {}
    for status, (name, description) in _ERRORS.items():
        if status == "413":
            description += f" ({limits.max_body_bytes} bytes)"
        response = _json(description, _ref("ErrorResponse"))
        if status in ("429", "503"):
            response["headers"].update(_RETRY_AFTER)
        if status == "401":
            response["headers"]["WWW-Authenticate"] = {"schema": {"const": "Bearer"}}
        responses[name] = response
    return responses
