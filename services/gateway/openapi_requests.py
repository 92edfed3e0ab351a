"""JSON Schemas of the request bodies the gateway accepts, for its OpenAPI document (openapi.py).

They describe what openai_protocol.py really takes, with the bounds it enforces: a field the
parser refuses is absent or marked refused, a limit the operator sets (RequestLimits) is the
schema's maximum. JSON `null` is "not given" for every optional field, so each one allows it.
Some rules cross fields and are only described: best_of must equal n, top_logprobs needs
logprobs, max_completion_tokens wins over max_tokens.
"""

from __future__ import annotations

from typing import Any

from services.gateway.openai_fields import INT32_MAX, INT32_MIN
from services.gateway.openai_protocol import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    MAX_CHAT_TOP_LOGPROBS,
    MAX_COMPLETION_LOGPROBS,
)
from services.gateway.request_limits import RequestLimits
from services.gateway.request_validator import default_max_tokens

Schema = dict[str, Any]

_SEED_MAX = 2**63 - 1
# A refused feature passes only when "off": absent or any JSON-falsy value.
_OFF: Schema = {
    "anyOf": [
        {"type": "null"},
        {"const": False},
        {"const": 0},
        {"const": ""},
        {"type": "array", "maxItems": 0},
        {"type": "object", "maxProperties": 0},
    ],
    "description": "Not supported: refused unless absent, null or empty.",
}


# Left out, a sampling field takes the serving model's recommended value when it has one.
_MODEL = ", or the model's recommended value (README: Model defaults)"


def optional(schema: Schema) -> Schema:
    """The schema, or null (meaning "not given")."""
    return {"anyOf": [schema, {"type": "null"}]}


def _int(low: int | None, high: int | None, description: str) -> Schema:
    schema: Schema = {"type": "integer", "description": description}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return optional(schema)


def _number(description: str, **bounds: float) -> Schema:
    return optional({"type": "number", "description": description, **bounds})


def _bool(description: str) -> Schema:
    return optional({"type": "boolean", "description": description})


def _token_ids(max_items: int | None = None) -> Schema:
    schema: Schema = {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": INT32_MAX},
        "description": "Token ids; each must also be below the model's vocabulary size.",
    }
    if max_items:
        schema["maxItems"] = max_items
    return schema


def _max_tokens(limits: RequestLimits, preferred: int | None = None) -> Schema:
    cap = limits.max_tokens or INT32_MAX
    default = default_max_tokens(1, limits, preferred).limit
    return _int(
        1,
        cap,
        f"Most tokens to generate per choice. Default {default}, fewer when the prompt leaves "
        "less room in the context; a value given is never cut: a 400 if it does not fit.",
    )


def _shared_properties(limits: RequestLimits) -> dict[str, Schema]:
    """Fields both endpoints read the same way (openai_protocol._template, _sampling, _parsed)."""
    stop_string: Schema = {"type": "string", "minLength": 1}
    return {
        "model": {"type": "string", "minLength": 1, "description": "A model id or alias."},
        "temperature": _number(f"Default 1{_MODEL}; 0 is greedy.", minimum=0, maximum=2),
        "top_p": _number(
            f"Nucleus sampling; default 1 (off){_MODEL}.", exclusiveMinimum=0, maximum=1
        ),
        "top_k": _int(
            -1, INT32_MAX, f"Keep the k most likely tokens; -1 or 0 is off. Default off{_MODEL}."
        ),
        "min_p": _number(f"Default 0 (off){_MODEL}.", minimum=0, maximum=1),
        "repetition_penalty": _number(f"Default 1 (off){_MODEL}.", exclusiveMinimum=0, maximum=2),
        "presence_penalty": _number("Default 0.", minimum=-2, maximum=2),
        "frequency_penalty": _number("Default 0.", minimum=-2, maximum=2),
        "seed": _int(0, _SEED_MAX, "Makes sampling reproducible."),
        "stop": optional(
            {
                "anyOf": [
                    stop_string,
                    {"type": "array", "items": stop_string, "maxItems": limits.max_stop_sequences},
                ],
                "description": "Generation ends before any of these strings.",
            }
        ),
        "stop_token_ids": optional(_token_ids()),
        "ignore_eos": _bool("Keep generating past the end-of-sequence token."),
        "skip_special_tokens": _bool("Leave special tokens out of the text; default true."),
        "priority": _int(INT32_MIN, INT32_MAX, "Higher is scheduled first; default 0."),
        "n": _int(1, limits.max_n, "Choices to generate; default 1."),
        "best_of": _int(1, None, "Accepted only when equal to n."),
        "stream": _bool("Answer with server-sent events."),
        "stream_options": optional(
            {
                "type": "object",
                "properties": {"include_usage": _bool("A last chunk with the usage.")},
            }
        ),
        "logit_bias": _OFF,
        **_structured_properties(),
    }


def _structured_properties() -> dict[str, Schema]:
    """vLLM's output constraints (openai_structured.py); at most one per request."""
    choice: Schema = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    text: Schema = {"type": "string", "minLength": 1}
    return {
        "guided_json": optional({"type": ["object", "string"], "description": "A JSON schema."}),
        "guided_regex": optional({**text, "description": "A regex the output matches."}),
        "guided_choice": optional({**choice, "description": "The output is one of these."}),
        "guided_grammar": optional({**text, "description": "A Lark (or GBNF) grammar."}),
        "structured_outputs": optional(
            {
                "type": "object",
                "properties": {
                    "json": optional({"type": ["object", "string"]}),
                    "regex": optional(text),
                    "choice": optional(choice),
                    "grammar": optional(text),
                    "json_object": optional({"const": True}),
                },
                "description": "vLLM's newer spelling of the guided_* fields: set one.",
            }
        ),
    }


def _response_format() -> Schema:
    json_schema: Schema = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
            "description": optional({"type": "string"}),
            "schema": optional({"type": ["object", "string"]}),
            "strict": _bool("Accepted; the schema is always enforced."),
        },
    }
    return optional(
        {
            "anyOf": [
                {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}},
                {
                    "type": "object",
                    "required": ["type", "json_schema"],
                    "properties": {"type": {"const": "json_schema"}, "json_schema": json_schema},
                },
            ],
            "description": "Constrains the output to JSON, or to a JSON schema, by a grammar.",
        }
    )


def _tools(limits: RequestLimits) -> dict[str, Schema]:
    function: Schema = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"},
            "description": optional({"type": "string"}),
            "parameters": optional({"type": ["object", "string"]}),
            "strict": _bool("Accepted; required calls always match the parameters."),
        },
    }
    tool: Schema = {
        "type": "object",
        "required": ["function"],
        "properties": {"type": {"const": "function"}, "function": function},
    }
    named: Schema = {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": {"const": "function"},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}},
            },
        },
    }
    return {
        "tools": optional({"type": "array", "items": tool, "maxItems": limits.max_tools}),
        "tool_choice": optional(
            {
                "anyOf": [{"enum": ["none", "auto", "required"]}, named],
                "description": "required and a named function are enforced by a grammar.",
            }
        ),
        "parallel_tool_calls": _bool("With required: several calls; default true."),
    }


def completion_request(limits: RequestLimits) -> Schema:
    text: Schema = {"type": "string", "minLength": 1}
    ids = {**_token_ids(limits.max_prompt_tokens), "minItems": 1}
    prompt = {
        "anyOf": [
            text,
            ids,
            {"type": "array", "items": text, "minItems": 1, "maxItems": 1},
            {"type": "array", "items": ids, "minItems": 1, "maxItems": 1},
        ],
        "description": "A string or token ids; a batch of more than one prompt is refused.",
    }
    return {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            **_shared_properties(limits),
            "prompt": prompt,
            "max_tokens": _max_tokens(limits, DEFAULT_COMPLETION_MAX_TOKENS),
            "logprobs": _int(0, MAX_COMPLETION_LOGPROBS, "Top alternatives per token."),
            "echo": optional(
                {
                    "type": "boolean",
                    "description": "Each choice starts with the prompt; with logprobs, so do "
                    "its logprobs (the prompt's tokens, the first one's null).",
                }
            ),
            "suffix": _OFF,
        },
    }


def chat_request(limits: RequestLimits) -> Schema:
    return {
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **_shared_properties(limits),
            "messages": {
                "type": "array",
                "minItems": 1,
                "maxItems": limits.max_messages,
                "items": {"$ref": "#/components/schemas/ChatMessage"},
            },
            "max_tokens": _max_tokens(limits),
            "max_completion_tokens": _max_tokens(limits),
            "logprobs": _bool("Return the sampled tokens' logprobs."),
            "top_logprobs": _int(0, MAX_CHAT_TOP_LOGPROBS, "Needs logprobs: true."),
            "add_generation_prompt": _bool("Open the assistant's turn; default true."),
            "response_format": _response_format(),
            **_tools(limits),
            "functions": optional({"not": {}, "description": "Deprecated: use tools."}),
            "function_call": optional({"not": {}, "description": "Deprecated: use tool_choice."}),
        },
    }


def chat_message() -> Schema:
    """One turn; content is text or text parts, and only an assistant turn may omit it."""
    part: Schema = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    }
    content: Schema = {"anyOf": [{"type": "string"}, {"type": "array", "items": part}]}
    call: Schema = {
        "type": "object",
        "required": ["function"],
        "properties": {
            "id": optional({"type": "string"}),
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
            },
        },
    }
    return {
        "anyOf": [
            {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["system", "developer", "user"]},
                    "content": content,
                },
            },
            {
                "type": "object",
                "required": ["role"],
                "properties": {
                    "role": {"const": "assistant"},
                    "content": optional(content),
                    "tool_calls": optional({"type": "array", "items": call}),
                },
            },
            {
                "type": "object",
                "required": ["role", "content", "tool_call_id"],
                "properties": {
                    "role": {"const": "tool"},
                    "content": content,
                    "tool_call_id": {"type": "string", "minLength": 1},
                },
            },
        ],
        "description": "developer is read as system; function turns are refused.",
    }
