"""Malformed and absurd HTTP requests: each gets a 4xx with an OpenAI ErrorResponse that names
the problem, nothing hangs, and the gateway serves a normal request afterwards."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from services.gateway.request_limits import DEFAULT_LIMITS
from services.stack import Stack
from tests.openai_schema import validate
from tests.reliability.conftest import AUTH, MODEL, serves_normally

TIMEOUT = 60.0
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
_M = MODEL.encode()


def chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def completion(**fields) -> dict:
    return {"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields}


def nested(depth: int) -> bytes:
    return b'{"model":"%s","prompt":"hi","x":' % _M + b"[" * depth + b"]" * depth + b"}"


# (path, body: raw bytes or a JSON-able object, what the error must name: its param or, for
# errors about the whole body, a word of its message)
BAD_BODIES = {
    "malformed JSON": (CHAT, b'{"model": "x", "messages": [', "not valid JSON"),
    "empty body": (CHAT, b"", "not valid JSON"),
    "array body": (CHAT, b"[1, 2]", "JSON object"),
    "string body": (COMPLETIONS, b'"prompt"', "JSON object"),
    "null body": (COMPLETIONS, b"null", "JSON object"),
    "invalid UTF-8": (COMPLETIONS, b'{"model":"%s","prompt":"\xff\xfe"}' % _M, "not valid JSON"),
    "lone surrogate": (COMPLETIONS, b'{"model":"%s","prompt":"\\ud800"}' % _M, "surrogate"),
    "surrogate in a key": (
        COMPLETIONS,
        b'{"\\udc00":1,"model":"%s","prompt":"hi"}' % _M,
        "surrogate",
    ),
    "deeply nested JSON": (COMPLETIONS, nested(100_000), "nested too deeply"),
    "4000-digit number": (COMPLETIONS, b'{"model":"x","n":' + b"9" * 5000 + b"}", "JSON"),
    "max_tokens -1": (COMPLETIONS, completion(max_tokens=-1), "max_tokens"),
    "max_tokens 10**12": (COMPLETIONS, completion(max_tokens=10**12), "max_tokens"),
    "max_tokens 1e308": (CHAT, chat(max_tokens=1e308), "max_tokens"),
    "max_completion_tokens 0": (CHAT, chat(max_completion_tokens=0), "max_completion_tokens"),
    "temperature NaN": (
        COMPLETIONS,
        b'{"model":"%s","prompt":"hi","temperature":NaN}' % _M,
        "temperature",
    ),  # noqa: E501
    "temperature -Infinity": (
        COMPLETIONS,
        b'{"model":"%s","prompt":"hi","temperature":-Infinity}' % _M,
        "temperature",
    ),  # noqa: E501
    "temperature 1e308": (CHAT, chat(temperature=1e308), "temperature"),
    "temperature 10**400": (CHAT, chat(temperature=10**400), "temperature"),
    "n 0": (CHAT, chat(n=0), "n"),
    "n 10**6": (CHAT, chat(n=10**6), "n"),
    "n true": (CHAT, chat(n=True), "n"),
    "logprobs 1000": (COMPLETIONS, completion(logprobs=1000), "logprobs"),
    "top_logprobs 1000": (CHAT, chat(logprobs=True, top_logprobs=1000), "top_logprobs"),
    "top_p 2": (CHAT, chat(top_p=2), "top_p"),
    "top_k 10**12": (CHAT, chat(top_k=10**12), "top_k"),
    "seed -1": (CHAT, chat(seed=-1), "seed"),
    "priority 10**12": (CHAT, chat(priority=10**12), "priority"),
    "stop: 1000 strings": (CHAT, chat(stop=["x"] * 1000), "stop"),
    "stop: not strings": (CHAT, chat(stop=[1, 2]), "stop"),
    "stop_token_ids huge": (CHAT, chat(stop_token_ids=[2**40]), "stop_token_ids"),
    "prompt of huge token ids": (COMPLETIONS, completion(prompt=[2**40, 10**30]), "prompt"),
    "prompt of negative ids": (COMPLETIONS, completion(prompt=[5, -1]), "prompt"),
    "prompt of ids past the vocabulary": (
        COMPLETIONS,
        completion(prompt=[2**31 - 1]),
        "vocabulary",
    ),  # noqa: E501
    "prompt of floats": (COMPLETIONS, completion(prompt=[1.5]), "prompt"),
    "prompt as an object": (COMPLETIONS, completion(prompt={"a": 1}), "prompt"),
    "batched prompts": (COMPLETIONS, completion(prompt=["a", "b"]), "prompt"),
    "messages not a list": (CHAT, chat(messages="hi"), "messages"),
    "messages empty": (CHAT, chat(messages=[]), "messages"),
    "message not an object": (CHAT, chat(messages=["hi"]), "messages[0]"),
    "unknown role": (CHAT, chat(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
    "role a number": (CHAT, chat(messages=[{"role": 5, "content": "x"}]), "messages[0].role"),
    "role a list": (CHAT, chat(messages=[{"role": ["user"], "content": "x"}]), "messages[0].role"),
    "role an object": (CHAT, chat(messages=[{"role": {}, "content": "x"}]), "messages[0].role"),
    "tool message without its call id": (
        CHAT,
        chat(messages=[{"role": "tool", "content": "x"}]),
        "messages[0].tool_call_id",
    ),
    "content a number": (
        CHAT,
        chat(messages=[{"role": "user", "content": 5}]),
        "messages[0].content",
    ),  # noqa: E501
    "image part": (
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "messages[0].content[0].type",
    ),
    "model a number": (CHAT, chat(model=5), "model"),
    "model missing": (CHAT, {"messages": [{"role": "user", "content": "x"}]}, "model"),
    "stream a string": (CHAT, chat(stream="yes"), "stream"),
    "response_format of an unknown type": (
        CHAT,
        chat(response_format={"type": "yaml"}),
        "response_format",
    ),
    "json_schema whose schema is not one": (
        CHAT,
        chat(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}),
        "response_format",
    ),
    "tool whose parameters are not a schema": (
        CHAT,
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": 5}}]),
        "tools[0].function.parameters",
    ),
}


def _post(stack: Stack, path: str, body: bytes | dict) -> httpx.Response:
    headers = {**AUTH, "Content-Type": "application/json"}
    if isinstance(body, bytes):
        return httpx.post(stack.http_url + path, content=body, headers=headers, timeout=TIMEOUT)
    return httpx.post(stack.http_url + path, json=body, headers=headers, timeout=TIMEOUT)


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_bad_body_is_a_named_4xx(null_stack: Stack, case: str):
    path, body, named = BAD_BODIES[case]
    response = _post(null_stack, path, body)
    assert response.status_code == 400, response.text
    error = response.json()
    validate(error, "ErrorResponse")
    assert error["error"]["param"] == named or named in error["error"]["message"], error


def _oversized_body(total: int, piece: int = 1 << 20) -> Iterator[bytes]:
    """A completion request of exactly `total` bytes, in pieces."""
    head, tail = b'{"model":"%s","prompt":"' % _M, b'"}'
    yield head
    filler = total - len(head) - len(tail)
    for start in range(0, filler, piece):
        yield b"a" * min(piece, filler - start)
    yield tail


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_body_over_the_limit_is_413(null_stack: Stack, chunked: bool):
    # One byte over: the gateway has read all of it when it refuses, so the client is never
    # cut off mid-write, and it must answer rather than wait for more.
    body = _oversized_body(DEFAULT_LIMITS.max_body_bytes + 1)
    content = body if chunked else b"".join(body)
    headers = {**AUTH, "Content-Type": "application/json"}
    url = null_stack.http_url + COMPLETIONS
    response = httpx.post(url, content=content, headers=headers, timeout=TIMEOUT)
    assert response.status_code == 413, response.text
    validate(response.json(), "ErrorResponse")
    assert str(DEFAULT_LIMITS.max_body_bytes) in response.json()["error"]["message"]


def test_gateway_serves_after_bad_input(null_stack: Stack):
    serves_normally(null_stack)
