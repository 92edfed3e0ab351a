"""The OpenAPI document is honest: it lists exactly the routes the app serves, it is
self-contained, its request schemas accept what the parser accepts and refuse what it refuses,
and its bounds follow the operator's limits."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from services.common.errors import InvalidArgument
from services.gateway.http_app import create_app
from services.gateway.openai_protocol import parse_chat_request, parse_completion_request
from services.gateway.openapi import openapi_document
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from tests.unit.gateway.conftest import API_KEY, front_door
from tests.unit.gateway.echo_backend import EchoBackend

DOCUMENT = openapi_document(DEFAULT_LIMITS)


def _validator(document: dict[str, Any], name: str) -> Draft202012Validator:
    resource = Resource.from_contents(document, default_specification=DRAFT202012)
    registry = Registry().with_resource("urn:doc", resource)
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry)


def test_documents_exactly_the_served_routes() -> None:
    app = create_app(EchoBackend())
    served = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"  # aiohttp adds HEAD to every GET
    }
    documented = {(method, path) for path, item in DOCUMENT["paths"].items() for method in item}
    assert documented == served


def test_is_self_contained() -> None:
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            refs.extend([node["$ref"]] if "$ref" in node else [])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(DOCUMENT)
    assert refs
    for ref in refs:
        assert ref.startswith("#/"), ref
        target: Any = DOCUMENT
        for part in ref[2:].split("/"):
            target = target[part]  # KeyError: a dangling reference


COMPLETIONS = [
    {"model": "m", "prompt": "hi"},
    {"model": "m", "prompt": [1, 2, 3], "max_tokens": 5, "n": 16, "stop": ["a", "b"]},
    {"model": "m", "prompt": [[1, 2]], "temperature": None, "logprobs": 5, "echo": False},
    {"model": "m", "prompt": ["hi"], "top_k": -1, "seed": 2**63 - 1, "suffix": ""},
    {"model": "m", "prompt": ""},
    {"model": "m", "prompt": ["a", "b"]},
    {"model": "m", "prompt": [2**31]},
    {"model": "m", "prompt": "hi", "max_tokens": 0},
    {"model": "m", "prompt": "hi", "n": 17},
    {"model": "m", "prompt": "hi", "logprobs": 6},
    {"model": "m", "prompt": "hi", "echo": True},
    {"model": "m", "prompt": "hi", "stop": ["a"] * 5},
    {"model": "m", "prompt": "hi", "top_p": 0},
    {"model": "m", "prompt": "hi", "priority": 2**31},
    {"model": "m", "prompt": "hi", "logit_bias": {"1": 5}},
    {"prompt": "hi"},
]
_USER = [{"role": "user", "content": "hi"}]
CHATS = [
    {"model": "m", "messages": _USER},
    {"model": "m", "messages": [{"role": "assistant"}, {"role": "developer", "content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]},
    {"model": "m", "messages": _USER, "logprobs": True, "top_logprobs": 20, "tools": []},
    {"model": "m", "messages": _USER, "response_format": {"type": "text"}},
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "user"}]},
    {"model": "m", "messages": [{"role": "tool", "content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
    {"model": "m", "messages": _USER, "top_logprobs": 21, "logprobs": True},
    {"model": "m", "messages": _USER, "max_completion_tokens": 0},
    {"model": "m", "messages": _USER, "response_format": {"type": "json_object"}},
    {"model": "m", "messages": _USER, "response_format": {"type": "json_schema"}},
    {"model": "m", "messages": _USER, "guided_choice": ["a", "b"]},
    {"model": "m", "messages": _USER, "guided_choice": []},
    {"model": "m", "messages": _USER, "structured_outputs": {"regex": "[ab]+"}},
    {"model": "m", "messages": _USER, "tools": [{"type": "function"}]},
    {"model": "m", "messages": _USER, "tools": [{"function": {"name": "f"}}]},
    {
        "model": "m",
        "messages": _USER,
        "tools": [{"function": {"name": "f"}}],
        "tool_choice": "required",
    },
    {"model": "m", "messages": _USER, "tool_choice": "maybe"},
    {"model": "m", "messages": _USER, "functions": [{"name": "f"}]},
    {
        "model": "m",
        "messages": [
            {
                "role": "assistant",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "42"},
        ],
    },
    {"model": "m", "messages": _USER, "stream_options": {"include_usage": "yes"}},
]


def _accepted(parse, body: dict[str, Any]) -> bool:
    try:
        parse(json.loads(json.dumps(body)), request_id="r-1")
    except InvalidArgument:
        return False
    return True


@pytest.mark.parametrize(
    ("schema", "parse", "body"),
    [("CreateCompletionRequest", parse_completion_request, b) for b in COMPLETIONS]
    + [("CreateChatCompletionRequest", parse_chat_request, b) for b in CHATS],
)
def test_request_schema_agrees_with_the_parser(schema, parse, body) -> None:
    assert _validator(DOCUMENT, schema).is_valid(body) == _accepted(parse, body)


def test_bounds_follow_the_operators_limits() -> None:
    limits = RequestLimits(
        max_n=4, max_tokens=100, max_stop_sequences=2, max_body_bytes=1000, max_messages=2
    )
    document = openapi_document(limits)
    valid = _validator(document, "CreateChatCompletionRequest").is_valid
    assert valid({"model": "m", "messages": _USER, "n": 4, "max_tokens": 100, "stop": ["a", "b"]})
    assert not valid({"model": "m", "messages": _USER, "n": 5})
    assert not valid({"model": "m", "messages": _USER, "max_tokens": 101})
    assert not valid({"model": "m", "messages": _USER, "stop": ["a", "b", "c"]})
    assert not valid({"model": "m", "messages": _USER * 3})
    assert "1000 bytes" in document["components"]["responses"]["PayloadTooLarge"]["description"]


def test_the_default_max_tokens_is_documented_as_the_parser_applies_it() -> None:
    """The default a request without max_tokens gets, within the operator's caps."""

    def described(limits: RequestLimits, schema: str, field: str = "max_tokens") -> str:
        properties = openapi_document(limits)["components"]["schemas"][schema]["properties"]
        return json.dumps(properties[field])

    limits = RequestLimits(default_max_tokens=300)
    chat = described(limits, "CreateChatCompletionRequest")
    assert "Default 300, fewer when the prompt leaves less room" in chat
    assert "Default 16," in described(limits, "CreateCompletionRequest")
    capped = RequestLimits(default_max_tokens=300, max_tokens=200)
    assert "Default 200," in described(
        capped, "CreateChatCompletionRequest", "max_completion_tokens"
    )


async def test_served_without_a_key() -> None:
    app = create_app(EchoBackend(), front_door=front_door(API_KEY))
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/openapi.json")
        assert response.status == 200
        assert await response.json() == json.loads(json.dumps(DOCUMENT))
        assert (await client.get("/v1/models")).status == 401
