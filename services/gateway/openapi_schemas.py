"""JSON Schemas of the gateway's response bodies, for its OpenAPI document (openapi.py): the
shapes openai_responses.py and http_app.py build, adapted from OpenAI's own document with only
the fields the gateway sends."""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_INT: Schema = {"type": "integer", "minimum": 0}
_FINISH_REASON: Schema = {"enum": ["stop", "length"]}
_NULL: Schema = {"type": "null"}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(properties: dict[str, Schema], description: str = "") -> Schema:
    """An object whose listed properties are all present (extra ones may follow)."""
    schema: Schema = {"type": "object", "required": list(properties), "properties": properties}
    if description:
        schema["description"] = description
    return schema


def _envelope(object_name: str, choice: Schema) -> dict[str, Schema]:
    return {
        "id": {"type": "string"},
        "object": {"const": object_name},
        "created": {"type": "integer", "description": "Unix time, seconds."},
        "model": {"type": "string", "description": "The model that served it."},
        "choices": {"type": "array", "items": choice},
        "usage": _ref("CompletionUsage"),
    }


def _completion_logprobs() -> Schema:
    return _object(
        {
            "tokens": {"type": "array", "items": {"type": "string"}},
            "token_logprobs": {"type": "array", "items": {"type": "number"}},
            "top_logprobs": {
                "type": "array",
                "items": {"type": "object", "additionalProperties": {"type": "number"}},
            },
            "text_offset": {"type": "array", "items": _INT},
        }
    )


def _chat_token_logprob() -> Schema:
    alternative = {
        "token": {"type": "string"},
        "logprob": {"type": "number", "description": "-9999.0 stands for -infinity."},
        "bytes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}},
    }
    return _object(
        {**alternative, "top_logprobs": {"type": "array", "items": _object(alternative)}}
    )


def _chat_message() -> Schema:
    return _object(
        {
            "role": {"const": "assistant"},
            "content": {"type": ["string", "null"]},
            "refusal": _NULL,
        }
    )


def response_schemas() -> dict[str, Schema]:
    completion_choice = _object(
        {
            "index": _INT,
            "text": {"type": "string"},
            "logprobs": {"anyOf": [_ref("CompletionLogprobs"), _NULL]},
            "finish_reason": _FINISH_REASON,
        }
    )
    chat_choice = _object(
        {
            "index": _INT,
            "message": _chat_message(),
            "logprobs": {"anyOf": [_ref("ChatLogprobs"), _NULL]},
            "finish_reason": _FINISH_REASON,
        }
    )
    usage = _object(
        {"prompt_tokens": _INT, "completion_tokens": _INT, "total_tokens": _INT},
        "Token counts; the prompt counts once however many choices.",
    )
    usage["properties"]["prompt_tokens_details"] = _object({"cached_tokens": _INT})
    return {
        "CreateCompletionResponse": _object(_envelope("text_completion", completion_choice)),
        "CreateChatCompletionResponse": _object(_envelope("chat.completion", chat_choice)),
        "CompletionUsage": usage,
        "CompletionLogprobs": _completion_logprobs(),
        "ChatLogprobs": _object(
            {"content": {"type": "array", "items": _chat_token_logprob()}, "refusal": _NULL}
        ),
        "Model": _object(
            {
                "id": {"type": "string"},
                "object": {"const": "model"},
                "created": {"type": "integer"},
                "owned_by": {"type": "string"},
                "max_model_len": {**_INT, "description": "Longest prompt + completion."},
            }
        ),
        "ListModelsResponse": _object(
            {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Model")}}
        ),
        "Usage": _object(
            {
                "object": {"const": "usage"},
                "prompt_tokens": _INT,
                "completion_tokens": _INT,
                "cached_tokens": _INT,
                "requests": _INT,
            },
            "The calling key's own counters.",
        ),
        "Status": _object({"status": {"type": "string"}}),
        "ErrorResponse": _object(
            {
                "error": _object(
                    {
                        "message": {"type": "string"},
                        "type": {"type": "string"},
                        "param": {"type": ["string", "null"]},
                        "code": {"type": ["string", "null"]},
                    }
                )
            }
        ),
    }
