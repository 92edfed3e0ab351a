"""The Responses and Anthropic Messages APIs in the gateway's OpenAPI document (openapi.py).

Their request and response bodies are OpenAI's and Anthropic's own, described here by the
fields the gateway reads and requires (what it refuses is said in the README); their errors
are OpenAI ErrorResponses on /v1/responses and Anthropic error bodies on /v1/messages.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_OBJECT = {"type": "object"}
_REQUEST_ID = {
    "X-Request-Id": {
        "required": True,
        "schema": {"type": "string"},
        "description": "The client's own X-Request-Id when it sent a plain one, else new.",
    }
}
_OPENAI_ERRORS = {
    "400": "BadRequest",
    "401": "Unauthorized",
    "404": "NotFound",
    "413": "PayloadTooLarge",
    "429": "RateLimited",
    "503": "Unavailable",
    "504": "Timeout",
}
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
    },
}


def api_schemas() -> dict[str, Schema]:
    """components/schemas entries."""
    return {
        "CreateResponseRequest": _request(
            ["model", "input"],
            {
                "model": {"type": "string"},
                "input": {"type": ["string", "array"]},
                "instructions": {"type": ["string", "null"]},
                "previous_response_id": {"type": ["string", "null"]},
                "store": {"type": ["boolean", "null"]},
                "stream": {"type": ["boolean", "null"]},
                "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
                "tools": {"type": ["array", "null"]},
                "text": {"type": ["object", "null"]},
            },
        ),
        "Response": _object_of("response"),
        "DeletedResponse": _object_of("response"),
        "CreateMessageRequest": _anthropic_request(["model", "messages", "max_tokens"]),
        "CountTokensRequest": _anthropic_request(["model", "messages"], counts=True),
        "Message": _object_of("message", key="type"),
        "MessageTokensCount": {
            "type": "object",
            "required": ["input_tokens"],
            "properties": {"input_tokens": {"type": "integer"}},
        },
        "AnthropicErrorResponse": _ANTHROPIC_ERROR,
    }


def api_paths() -> Schema:
    """paths entries."""
    response_id = {
        "name": "response_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    stored_errors = ("401", "404", "503")
    return {
        "/v1/responses": {
            "post": _post("createResponse", "CreateResponseRequest", "Response", anthropic=False)
        },
        "/v1/responses/{response_id}": {
            "get": {
                **_operation("getResponse", _json("Response"), _error_refs(stored_errors)),
                "parameters": [response_id],
            },
            "delete": {
                **_operation(
                    "deleteResponse", _json("DeletedResponse"), _error_refs(stored_errors)
                ),
                "parameters": [response_id],
            },
        },
        "/v1/messages": {
            "post": _post("createMessage", "CreateMessageRequest", "Message", anthropic=True)
        },
        "/v1/messages/count_tokens": {
            "post": _post("countTokens", "CountTokensRequest", "MessageTokensCount", True, False)
        },
    }


def _post(
    operation_id: str, request: str, response: str, anthropic: bool, streams: bool = True
) -> Schema:
    ok = _json(response)
    if streams:
        ok["content"]["text/event-stream"] = {
            "schema": {
                "type": "object",
                "description": "stream true: typed events (`event:` the type, `data:` the JSON "
                "event), as the reference API sends them; a failure after the first event is "
                "an `error` event, the last one.",
            }
        }
    errors = _anthropic_errors() if anthropic else _error_refs(tuple(_OPENAI_ERRORS))
    operation = _operation(operation_id, ok, errors)
    operation["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": _ref(request)}},
    }
    if anthropic:
        operation["security"] = [{"bearer": []}, {"x-api-key": []}]
    return operation


def _operation(operation_id: str, ok: Schema, errors: Schema) -> Schema:
    return {"operationId": operation_id, "responses": {"200": ok, **errors}}


def _json(schema: str) -> Schema:
    return {
        "description": "OK",
        "headers": dict(_REQUEST_ID),
        "content": {"application/json": {"schema": _ref(schema)}},
    }


def _error_refs(statuses: tuple[str, ...]) -> Schema:
    return {s: {"$ref": f"#/components/responses/{_OPENAI_ERRORS[s]}"} for s in statuses}


def _anthropic_errors() -> Schema:
    described = {
        "400": "invalid_request_error",
        "401": "authentication_error",
        "404": "not_found_error",
        "413": "request_too_large",
        "429": "rate_limit_error",
        "503": "overloaded_error",
        "504": "timeout_error",
    }
    return {
        status: {
            "description": f"An Anthropic error body, error.type {kind}.",
            "headers": dict(_REQUEST_ID),
            "content": {"application/json": {"schema": _ref("AnthropicErrorResponse")}},
        }
        for status, kind in described.items()
    }


def _request(required: list[str], properties: Schema) -> Schema:
    return {"type": "object", "required": required, "properties": properties}


def _anthropic_request(required: list[str], counts: bool = False) -> Schema:
    """counts: count_tokens' body, which has no max_tokens, stop sequences or stream."""
    properties = {
        "model": {"type": "string"},
        "messages": {"type": "array", "minItems": 1},
        "system": {"type": ["string", "array"]},
        "tools": {"type": "array"},
        "tool_choice": _OBJECT,
    }
    if not counts:
        properties["max_tokens"] = {"type": "integer", "minimum": 1}
        properties["stop_sequences"] = {"type": "array", "items": {"type": "string"}}
        properties["stream"] = {"type": "boolean"}
    return _request(required, properties)


def _object_of(name: str, key: str = "object") -> Schema:
    return {
        "type": "object",
        "required": ["id", key],
        "properties": {"id": {"type": "string"}, key: {"const": name}},
    }


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}
