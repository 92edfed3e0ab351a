"""Issue 27: a body that is costly to parse does not hold the gateway's event loop. An 8 MiB
body of millions of empty lists took json.loads over half a second, on the loop, while every
other client waited; it is parsed in a child process now (json_body.py) and refused for its
count of values. Measured in CPU time of the loop's thread, so that it holds on a busy machine."""

from __future__ import annotations

import asyncio
import json
import time

from aiohttp.test_utils import TestClient, TestServer

from services.gateway.http_app import create_app
from services.gateway.json_body import INLINE_BYTES, MAX_VALUES
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _hostile_body() -> bytes:
    """Half a million empty lists (1.5 MiB; the 8 MiB limit holds 2.8 million)."""
    head, tail = b'{"model":"' + MODEL.encode() + b'","messages":[', b"]}"
    return head + b",".join([b"[]"] * (2 * MAX_VALUES)) + tail


async def test_a_body_costly_to_parse_does_not_hold_the_loop() -> None:
    raw = _hostile_body()
    started = time.thread_time()
    json.loads(raw)  # what the loop's thread paid for it before
    inline_cost = time.thread_time() - started
    async with TestClient(TestServer(create_app(EchoBackend()))) as client:
        headers = {"Content-Type": "application/json"}
        await client.post("/v1/chat/completions", json=CHAT)  # warm: the pool's children
        started = time.thread_time()
        hostile = asyncio.create_task(
            client.post("/v1/chat/completions", data=raw, headers=headers)
        )
        others = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(5)]
        response = await hostile
        loop_cost = time.thread_time() - started
        assert [r.status for r in others] == [200] * 5
        assert response.status == 400
        assert f"more than {MAX_VALUES} JSON values" in (await response.json())["error"]["message"]
    # Sending it, reading it and answering the others remain; the parse does not.
    assert loop_cost < inline_cost / 2, (loop_cost, inline_cost)


async def test_a_big_legitimate_body_is_served() -> None:
    """A body bigger than INLINE_BYTES goes through the child and is served (or refused for
    what it is: broken JSON is a 400 naming it)."""
    headers = {"Content-Type": "application/json"}
    body = json.dumps({**CHAT, "stop": ["END"]}) + " " * INLINE_BYTES  # whitespace is JSON
    async with TestClient(TestServer(create_app(EchoBackend()))) as client:
        response = await client.post("/v1/chat/completions", data=body, headers=headers)
        assert response.status == 200, await response.text()
        assert (await response.json())["choices"][0]["message"]["content"]
        bad = await client.post("/v1/chat/completions", data="[" + body, headers=headers)
        assert bad.status == 400
        assert "not valid JSON" in (await bad.json())["error"]["message"]
