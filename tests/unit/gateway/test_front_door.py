"""The front door over HTTP: per-key limits, model access, the gateway's in-flight bound,
request limits, and usage, each as a client sees it (status, Retry-After, error body)."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer

from services.gateway.api_keys import ApiKey, KeyLimits, KeyRing, hash_key
from services.gateway.front_door import FrontDoor
from services.gateway.http_app import create_app
from services.gateway.request_limits import RequestLimits
from tests.openai_schema import validate
from tests.unit.gateway.conftest import front_door
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

BODY = {"model": MODEL, "prompt": "one two three", "max_tokens": 3}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def post(client: TestClient, key: str, body: dict = BODY, **kwargs):
    return await client.post("/v1/completions", json=body, headers=auth(key), **kwargs)


async def refused(response, status: int, *words: str) -> dict:
    assert response.status == status, await response.text()
    body = await response.json()
    validate(body, "ErrorResponse")
    for word in words:
        assert word in body["error"]["message"]
    return body


async def test_a_key_over_its_request_rate_gets_429_with_retry_after():
    door = front_door("k1", "k2", limits=KeyLimits(requests_per_minute=2))
    async with TestClient(TestServer(create_app(EchoBackend(), front_door=door))) as client:
        assert [(await post(client, "k1")).status for _ in range(2)] == [200, 200]
        response = await post(client, "k1")
        await refused(response, 429, "2 requests per minute")
        assert 1 <= int(response.headers["Retry-After"]) <= 30
        assert (await post(client, "k2")).status == 200  # another key has its own budget


async def test_a_key_over_its_token_rate_waits_until_the_bucket_refills():
    # A request reserves 7 (4 estimated prompt tokens + max_tokens 3) and uses 6 (3 + 3): the
    # second finds 1 token in the bucket, not the 7 it needs.
    door = front_door("k1", limits=KeyLimits(tokens_per_minute=7))
    async with TestClient(TestServer(create_app(EchoBackend(), front_door=door))) as client:
        assert (await post(client, "k1")).status == 200
        response = await post(client, "k1")
        await refused(response, 429, "7 tokens per minute")
        assert int(response.headers["Retry-After"]) >= 12  # 6 tokens more at 7 a minute


async def test_concurrent_streams_per_key_are_bounded():
    door = front_door("k1", "k2", limits=KeyLimits(max_concurrent=1))
    backend = EchoBackend(token_delay=0.2)
    async with TestClient(TestServer(create_app(backend, front_door=door))) as client:
        slow = asyncio.ensure_future(post(client, "k1", {**BODY, "stream": True}))
        while not backend.requests:
            await asyncio.sleep(0.01)
        await refused(await post(client, "k1"), 429, "1 requests in flight")
        assert (await post(client, "k2")).status == 200
        assert (await (await slow).read()).endswith(b"data: [DONE]\n\n")
        assert (await post(client, "k1")).status == 200  # the place was given back


async def test_a_full_gateway_answers_503_at_once():
    door = front_door(max_inflight=1)
    backend = EchoBackend(token_delay=0.2)
    async with TestClient(TestServer(create_app(backend, front_door=door))) as client:
        slow = asyncio.ensure_future(post(client, "", BODY))
        while not backend.requests:
            await asyncio.sleep(0.01)
        response = await post(client, "", BODY)
        await refused(response, 503, "at capacity")
        assert response.headers["Retry-After"] == "1"
        assert (await slow).status == 200
        assert door.inflight == 0


async def test_a_key_sees_and_uses_only_its_models():
    key = ApiKey("narrow", hash_key("k1"), KeyLimits(), models=frozenset({"other-model"}))
    door = FrontDoor(KeyRing([key]))
    async with TestClient(TestServer(create_app(EchoBackend(), front_door=door))) as client:
        models = await (await client.get("/v1/models", headers=auth("k1"))).json()
        assert models["data"] == []
        response = await post(client, "k1")
        await refused(response, 404, "does not exist or you do not have access")
        response = await client.get(f"/v1/models/{MODEL}", headers=auth("k1"))
        await refused(response, 404, "does not exist or you do not have access")


async def test_usage_counts_each_keys_tokens():
    door = front_door("k1", "k2")
    async with TestClient(TestServer(create_app(EchoBackend(), front_door=door))) as client:
        await post(client, "k1")
        await post(client, "k1", {**BODY, "n": 2})
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "a b"}]}
        await client.post("/v1/chat/completions", json=chat, headers=auth("k2"))
        usage = await (await client.get("/v1/usage", headers=auth("k1"))).json()
        # Echo: 3 prompt tokens each; completions 3, then 2 choices x 3.
        assert usage["requests"] == 2
        assert usage["prompt_tokens"] == 6 and usage["completion_tokens"] == 9
        assert usage["cached_tokens"] == 2  # the echo backend reports 1 cached per request
        assert usage["scope"] == "this replica"
        other = await (await client.get("/v1/usage", headers=auth("k2"))).json()
        assert other["requests"] == 1
        assert (await client.get("/v1/usage")).status == 401


async def test_request_limits_name_the_field_and_the_limit():
    limits = RequestLimits(
        max_body_bytes=4096, max_prompt_tokens=4, max_tokens=8, max_n=2, max_stop_sequences=1
    )
    app = create_app(EchoBackend(), limits=limits)
    async with TestClient(TestServer(app)) as client:
        cases = [
            ({**BODY, "max_tokens": 9}, "max_tokens", "between 1 and 8"),
            ({**BODY, "n": 3}, "n", "between 1 and 2"),
            ({**BODY, "stop": ["a", "b"]}, "stop", "at most 1"),
            ({**BODY, "prompt": [1, 2, 3, 4, 5]}, "prompt", "at most 4 prompt tokens"),
        ]
        for body, param, words in cases:
            body_json = await refused(await post(client, "", body), 400, words)
            assert body_json["error"]["param"] == param
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post(
            "/v1/chat/completions", json={**chat, "max_completion_tokens": 100}
        )
        await refused(response, 400, "max_completion_tokens", "between 1 and 8")
        response = await post(client, "", {**BODY, "prompt": "x" * 5000})
        await refused(response, 413, "4096")
        assert (await post(client, "", BODY)).status == 200
