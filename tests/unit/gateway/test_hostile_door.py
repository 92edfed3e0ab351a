"""Issue 27's probes of the front door, over HTTP and the public gRPC port: a request larger
than its key's budget, text outside `messages` (tools, tool calls, empty messages), counts of
messages/tools/parts, priority above the key's cap. (Compressed bodies and slow connections:
test_hostile_connections.py.)"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.gateway.api_keys import ApiKey, KeyLimits, KeyRing, hash_key
from services.gateway.front_door import FrontDoor
from services.gateway.grpc_api import GatewayServicer, public_server
from services.gateway.http_app import create_app
from services.gateway.json_body import MAX_VALUES
from services.gateway.rate_limiter import LocalBuckets, RateLimiter
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

NO_LIMITS = KeyLimits()


class Door:
    """One gateway (HTTP and gRPC on one front door) with one key."""

    def __init__(self, limits: RequestLimits, key_limits: KeyLimits, max_priority: int) -> None:
        self.plain = uuid.uuid4().hex
        key = ApiKey("tenant", hash_key(self.plain), key_limits, max_priority=max_priority)
        self.front_door = FrontDoor(KeyRing([key]), RateLimiter(LocalBuckets(), fail_open=False))
        self.backend = EchoBackend()
        self.limits = limits
        self.http: TestClient | None = None
        self.grpc_call = None

    async def post(self, body: dict, path: str = "/v1/chat/completions") -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {self.plain}"}
        response = await self.http.post(path, json=body, headers=headers)
        return response.status, await response.json()

    async def generate(self, msg: gateway_pb2.GenerateRequest) -> tuple[grpc.StatusCode, str]:
        metadata = (("authorization", f"Bearer {self.plain}"),)
        try:
            async for _ in self.grpc_call(msg, metadata=metadata):
                pass
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details()
        return grpc.StatusCode.OK, ""


@asynccontextmanager
async def door(
    limits: RequestLimits = DEFAULT_LIMITS,
    key_limits: KeyLimits = NO_LIMITS,
    max_priority: int = 0,
) -> AsyncIterator[Door]:
    d = Door(limits, key_limits, max_priority)
    server = public_server(limits, [])
    servicer = GatewayServicer(d.backend, d.front_door, limits)
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    app = create_app(d.backend, front_door=d.front_door, limits=limits)
    try:
        async with (
            TestClient(TestServer(app)) as d.http,
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            d.grpc_call = channel.unary_stream(
                "/layerserve.gateway.v1.Gateway/Generate",
                request_serializer=gateway_pb2.GenerateRequest.SerializeToString,
                response_deserializer=gateway_pb2.GenerateResponse.FromString,
            )
            yield d
    finally:
        await server.stop(None)


def _chat(messages: list[dict] | None = None, **fields) -> dict:
    messages = messages or [{"role": "user", "content": "hi"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 4, **fields}


def _proto(body: dict) -> gateway_pb2.GenerateRequest:
    """The gRPC twin of a chat body of _chat."""
    msg = gateway_pb2.GenerateRequest(model=body["model"], max_tokens=body["max_tokens"])
    msg.chat.SetInParent()
    for m in body["messages"]:
        calls = [gateway_pb2.ToolCall(id=c["id"], **c["function"]) for c in m.get("tool_calls", [])]
        msg.chat.messages.add(
            role=m["role"],
            content=m.get("content") or "",
            tool_calls=calls,
            tool_call_id=m.get("tool_call_id", ""),
            name=m.get("name", ""),
        )
    for t in body.get("tools", []):
        msg.tools.add(name=t["function"]["name"], description=t["function"]["description"])
    return msg


def _tool(description: str, name: str = "f") -> dict:
    return {"type": "function", "function": {"name": name, "description": description}}


def _history_with_a_call(arguments: str) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


async def test_a_request_over_its_keys_whole_budget_is_refused_at_once():
    """tokens_per_minute 1000, max_tokens 8000: was admitted and generated 8,000 tokens (8x the
    budget); now 429 "Request too large" naming the limit and the size, nothing charged."""
    async with door(key_limits=KeyLimits(tokens_per_minute=1000)) as d:
        response = await d.http.post(
            "/v1/chat/completions",
            json=_chat(max_tokens=8000),
            headers={"Authorization": f"Bearer {d.plain}"},
        )
        error = (await response.json())["error"]
        assert response.status == 429 and "Retry-After" not in response.headers
        assert "Request too large" in error["message"] and "limit 1000" in error["message"]
        assert "requested 8" in error["message"]
        code, details = await d.generate(_proto(_chat(max_tokens=8000)))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "Request too large" in details
        assert not d.backend.requests
        assert (await d.post(_chat(max_tokens=900)))[0] == 200  # the bucket was not touched


def _outside(kind: str, size: int) -> dict:
    """A 2-character message and `size` characters of text outside the message contents."""
    if kind == "tools":
        return _chat(tools=[_tool("d" * size)])
    if kind == "tool-call-arguments":
        return _chat(_history_with_a_call('{"x": "' + "a" * size + '"}'), tools=[_tool("")])
    return _chat([{"role": "user", "content": "hi", "name": "n" * size}])


OUTSIDE = ["tools", "tool-call-arguments", "names"]


@pytest.mark.parametrize("kind", OUTSIDE)
async def test_text_outside_messages_is_reserved(kind):
    """A 2-character message with 40 KB of tools (or of call arguments, or a name) on a key of
    10,000 tokens per minute: was reserved as ~1 token and admitted; now its ~10,000 tokens
    are reserved, which is over the key's budget."""
    body = _outside(kind, 40_000)
    async with door(key_limits=KeyLimits(tokens_per_minute=10_000)) as d:
        status, response = await d.post(body)
        assert status == 429 and "Request too large" in response["error"]["message"]
        code, _ = await d.generate(_proto(body))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and not d.backend.requests


@pytest.mark.parametrize("kind", OUTSIDE)
@pytest.mark.parametrize(
    ("limits", "size"),
    [(RequestLimits(max_prompt_tokens=200), 30_000), (DEFAULT_LIMITS, 300_000)],
    ids=["prompt-limit", "context"],
)
async def test_text_outside_messages_counts_against_the_prompt_size(kind, limits, size):
    """Tools, call arguments, names: were not counted by the size guard and reached the
    tokenizer (2.75 M tokens of tools: 400 after 6-9 s); now a 400 naming messages before
    anything is tokenized: over LAYERSERVE_MAX_PROMPT_TOKENS (200 x 128 bytes), or over the
    model's context (the echo model's 2048 x 128 bytes) when no limit is set."""
    body = _outside(kind, size)
    async with door(limits) as d:
        await _refused_as_too_big(d, body)


async def test_every_message_counts_against_the_prompt_size_even_empty():
    """300 empty messages under a 200-token prompt limit: each is at least one token of the
    template, so they cannot fit; they passed the guard as 0 bytes."""
    async with door(RequestLimits(max_prompt_tokens=200)) as d:
        await _refused_as_too_big(d, _chat([{"role": "user", "content": ""}] * 300))


async def _refused_as_too_big(d: Door, body: dict) -> None:
    status, response = await d.post(body)
    assert status == 400 and response["error"]["param"] == "messages", response
    assert "cannot fit" in response["error"]["message"]
    code, details = await d.generate(_proto(body))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "cannot fit" in details
    assert not d.backend.requests


async def test_250000_empty_messages_are_refused_by_their_count():
    """Were parsed, built and templated (14 s, +95 MiB); now a 400 naming messages and the
    limit (LAYERSERVE_MAX_MESSAGES, 2048) before one message object is built. Over HTTP the
    body (750,000 JSON values) is refused sooner, by the parser's bound (json_body.py)."""
    body = _chat([{"role": "user", "content": ""}] * 250_000)
    async with door() as d:
        status, response = await d.post(body)
        assert status == 400 and f"more than {MAX_VALUES} JSON" in response["error"]["message"]
        status, response = await d.post(_chat([{"role": "user", "content": ""}] * 50_000))
        assert status == 400 and response["error"]["param"] == "messages"
        assert "at most 2048 items, got 50000" in response["error"]["message"]
        code, details = await d.generate(_proto(body))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 2048 items" in details


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (_chat(tools=[_tool("", f"f{i}") for i in range(5)]), "tools"),
        (_chat([{"role": "user", "content": [{"type": "text", "text": ""}] * 5}]), "content"),
        (_chat(tools=[_tool("", f"f{i}") for i in range(4)]), None),
    ],
    ids=["tools", "content-parts", "under-the-limits"],
)
async def test_tools_and_content_parts_are_counted(body, param):
    limits = RequestLimits(max_tools=4, max_content_parts=4)
    async with door(limits) as d:
        status, response = await d.post(body)
        if param is None:
            assert status == 200
            return
        assert status == 400 and param in response["error"]["param"]
        assert "at most 4 items" in response["error"]["message"]
        if param == "tools":
            code, details = await d.generate(_proto(body))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "at most 4 items" in details


async def test_tool_calls_of_one_turn_are_counted():
    calls = [{"id": f"c{i}", "function": {"name": "f", "arguments": "{}"}} for i in range(5)]
    body = _chat([{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": calls}])
    async with door(RequestLimits(max_tools=4)) as d:
        status, response = await d.post(body)
        assert status == 400 and response["error"]["param"] == "messages[1].tool_calls"
        code, details = await d.generate(_proto(body))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "messages[1].tool_calls" in details


@pytest.mark.parametrize(
    ("max_priority", "priority", "status"),
    [(0, 2**31 - 1, 400), (0, 1, 400), (0, -5, 200), (0, 0, 200), (10, 10, 200), (10, 11, 400)],
)
async def test_a_key_may_not_raise_its_priority_over_its_cap(max_priority, priority, status):
    """Any key could send priority 2^31-1 and jump every other tenant's queue; now a key's
    max_priority (keys file, default 0) caps it: it may only lower its own priority."""
    async with door(max_priority=max_priority) as d:
        got, response = await d.post(_chat(priority=priority))
        assert got == status
        if status == 400:
            assert response["error"]["param"] == "priority"
            assert f"over the {max_priority}" in response["error"]["message"]
            assert not d.backend.requests


async def test_the_operator_may_allow_more_tools_than_openai():
    body = _chat(tools=[_tool("", f"f{i}") for i in range(200)])
    async with door(RequestLimits(max_tools=256)) as d:
        assert (await d.post(body))[0] == 200
        assert (await d.generate(_proto(body)))[0] == grpc.StatusCode.OK
