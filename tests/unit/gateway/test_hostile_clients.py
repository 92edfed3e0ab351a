"""Issue 17's greedy and hostile clients against the gateway, in process (rows 1, 2, 4, 6, 9):
each test is a probe of the issue's table and what the client must now see."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from layerserve.gateway.v1 import gateway_pb2
from services.common.errors import ResourceExhausted
from services.common.max_tokens import MaxTokens
from services.gateway.api_keys import ApiKey, KeyLimits, KeyRing, bearer_token, hash_key
from services.gateway.backend import GenerationRequest
from services.gateway.concurrency import ConcurrencyLimiter, RedisLeases
from services.gateway.front_door import FrontDoor
from services.gateway.grpc_api import request_from_proto
from services.gateway.http_app import create_app
from services.gateway.rate_limiter import LocalBuckets, RateLimiter, RedisBuckets
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from services.gateway.tokenizer_client import request_to_proto
from tests.unit.gateway.echo_backend import MODEL, EchoBackend


def _key(limits: KeyLimits) -> tuple[str, ApiKey]:
    plain = uuid.uuid4().hex  # a fresh tenant per test: the session's Redis is shared
    return plain, ApiKey("greedy", hash_key(plain), limits)


def _request(max_tokens: int, prompt: str = "a b c") -> GenerationRequest:
    return GenerationRequest(
        request_id=uuid.uuid4().hex, model=MODEL, prompt=prompt, max_tokens=MaxTokens(max_tokens)
    )


async def _two_at_once(door: FrontDoor, key: ApiKey) -> list[str]:
    """Row 1's probe: two concurrent requests on one key of 1,000 tokens per minute, each of
    max_tokens 600 (8000, over the whole budget, is now refused outright:
    test_hostile_door.py)."""
    backend = EchoBackend()
    outcomes = []

    async def one() -> None:
        request = _request(600)
        request.ignore_eos = True
        try:
            async with door.admit(key, MODEL, backend, [request]) as metered:
                async for _ in metered.generate(request):
                    pass
            outcomes.append("ok")
        except ResourceExhausted:
            outcomes.append("429")

    await asyncio.gather(one(), one())
    return sorted(outcomes)


@pytest.mark.parametrize("where", ["local", "redis"])
async def test_a_token_limit_holds_within_one_requests_reservation(where, request):
    """tokens_per_minute=1000, max_concurrent=2, two requests of max_tokens 8000 at once were
    both 200 (16,000 tokens). Now a request is admitted only while the bucket holds its
    reservation: of two of 600, the first takes 602 and the second is refused."""
    plain, key = _key(KeyLimits(tokens_per_minute=1000, max_concurrent=2))
    if where == "redis":
        redis = Redis.from_url(request.getfixturevalue("redis_url"))
        buckets = RedisBuckets(redis)
    else:
        buckets = LocalBuckets()
    limiter = RateLimiter(buckets, fail_open=False)
    door = FrontDoor(KeyRing([key]), limiter)
    assert await _two_at_once(door, key) == ["429", "ok"]
    with pytest.raises(ResourceExhausted, match="1000 tokens per minute"):
        async with door.admit(key, MODEL, EchoBackend(), [_request(600)]):
            pass  # 603 of 1,000 tokens spent: another 602 do not fit before a refill


async def test_unused_reservation_is_given_back():
    _, key = _key(KeyLimits(tokens_per_minute=1000))
    limiter = RateLimiter(LocalBuckets(), fail_open=False)
    door = FrontDoor(KeyRing([key]), limiter)
    for _ in range(5):  # each reserves 3 + 900 but uses 6: all of them fit in a minute
        request = _request(900)
        async with door.admit(key, MODEL, EchoBackend(), [request]) as metered:
            async for _ in metered.generate(request):
                pass


async def test_concurrency_is_shared_by_replicas_and_leases_expire(redis_url):
    """max_concurrent=1 across two gateway replicas; a lease whose gateway died expires."""
    _, key = _key(KeyLimits(max_concurrent=1))
    redis = Redis.from_url(redis_url)
    first = ConcurrencyLimiter(RedisLeases(redis, lease_seconds=0.5), fail_open=False)
    second = ConcurrencyLimiter(RedisLeases(redis, lease_seconds=0.5), fail_open=False)
    held = await first.acquire(key)
    with pytest.raises(ResourceExhausted, match="1 requests in flight"):
        await second.acquire(key)
    await first.release(held)
    lost = await second.acquire(key)  # its gateway "dies": never released, never refreshed
    lost.refresher.cancel()
    with pytest.raises(ResourceExhausted):
        await first.acquire(key)
    await asyncio.sleep(0.6)
    await first.release(await first.acquire(key))


async def test_a_running_request_keeps_its_lease(redis_url):
    _, key = _key(KeyLimits(max_concurrent=1))
    redis = Redis.from_url(redis_url)
    leases = RedisLeases(redis, lease_seconds=0.3)
    first = ConcurrencyLimiter(leases, fail_open=False, refresh_every_s=0.1)
    held = await first.acquire(key)
    await asyncio.sleep(0.6)  # twice the lease time: refreshed meanwhile
    with pytest.raises(ResourceExhausted):
        await ConcurrencyLimiter(leases, fail_open=False).acquire(key)
    await first.release(held)


async def _post(body: dict | None, limits: RequestLimits = DEFAULT_LIMITS, **kwargs):
    backend = EchoBackend()
    async with TestClient(TestServer(create_app(backend, limits=limits))) as client:
        response = await client.post("/v1/chat/completions", json=body, **kwargs)
        return response.status, await response.json(), backend


def _chat(**fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "a b c"}], **fields}


async def test_n_times_max_tokens_is_capped():
    """Row 2: n=16 x max_tokens 8000 was 200; now a 400 naming max_tokens."""
    status, body, backend = await _post(_chat(n=16, max_tokens=8000))
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert "32768" in body["error"]["message"] and not backend.requests


async def test_a_request_without_max_tokens_gets_a_bounded_default():
    """Row 2: n=16 and no max_tokens was up to the context length per choice."""
    status, _, backend = await _post(_chat(n=16))
    assert status == 200
    assert {r.max_tokens for r in backend.requests} == {MaxTokens.cap(1024)}
    limits = RequestLimits(default_max_tokens=100, max_request_tokens=800)
    status, _, backend = await _post(_chat(n=16), limits)
    assert {r.max_tokens for r in backend.requests} == {
        MaxTokens.cap(50)
    }  # 800 / 16: within the cap


async def test_a_default_goes_down_as_a_cap_and_the_clients_own_max_tokens_as_is():
    """The scheduler lowers a cap to what fits the prompt, so a default is sent once (and
    tokenized once); a max_tokens the client set is never lowered: too long, it is a 400."""
    _, _, backend = await _post(_chat(n=2))
    assert [r.max_tokens for r in backend.requests] == [MaxTokens.cap(1024)] * 2
    wire = request_to_proto(backend.requests[0])
    assert (wire.max_tokens, wire.max_tokens_is_cap) == (1024, True)
    _, _, backend = await _post(_chat(max_tokens=1024))
    assert [r.max_tokens for r in backend.requests] == [MaxTokens(1024)]
    wire = request_to_proto(backend.requests[0])
    assert (wire.max_tokens, wire.max_tokens_is_cap) == (1024, False)
    grpc_default = request_from_proto(gateway_pb2.GenerateRequest(model=MODEL, prompt="a"), "g", {})
    assert grpc_default.max_tokens == MaxTokens.cap(1024)
    grpc_own = gateway_pb2.GenerateRequest(model=MODEL, prompt="a", max_tokens=9)
    assert request_from_proto(grpc_own, "g", {}).max_tokens == MaxTokens(9)


async def test_model_names_are_checked_and_never_echoed_whole(caplog):
    """Row 4: a newline forging a log line, a 7 MB name: a 400 quoting a short excerpt."""
    caplog.set_level(logging.INFO)
    forged = MODEL + "\n2026-12-01 00:00:00 ERROR services.gateway: forged"
    for model in (forged, "m" * 7_000_000):
        status, body, backend = await _post(_chat(model=model))
        assert status == 400 and body["error"]["param"] == "model"
        assert len(body["error"]["message"]) < 300 and not backend.requests
    assert all("\n" not in r.getMessage() for r in caplog.records)
    assert max(len(r.getMessage()) for r in caplog.records) < 1000


async def test_untrusted_text_in_error_messages_is_logged_escaped(caplog):
    caplog.set_level(logging.INFO, logger="services.gateway.http_app")
    part = {"type": "image\nERROR forged " + "x" * 100_000, "image_url": {}}
    body = _chat(messages=[{"role": "user", "content": [part]}])
    status, response, _ = await _post(body)
    assert status == 400 and len(response["error"]["message"]) < 300
    (record,) = [r for r in caplog.records if "InvalidArgument" in r.getMessage()]
    assert "\n" not in record.getMessage() and len(record.getMessage()) < 1000


async def test_a_prompt_too_big_for_the_context_is_refused_untokenized():
    """Row 6: 7.8 MB of prompt was 5.2 s of tokenizer CPU before the 400."""
    prompt = "word " * 1_600_000  # 8 MB; the echo model's context (2048) x 128 B is 256 KiB
    limits = RequestLimits(max_body_bytes=16 * 1024 * 1024)
    status, body, backend = await _post(
        _chat(messages=[{"role": "user", "content": prompt}]), limits
    )
    assert status == 400 and body["error"]["param"] == "messages" and not backend.requests
    limits = RequestLimits(max_body_bytes=16 * 1024 * 1024, max_prompt_tokens=100)
    request = {"model": MODEL, "prompt": "ü" * 6500}  # 13,000 bytes > 100 x 128
    backend = EchoBackend()
    async with TestClient(TestServer(create_app(backend, limits=limits))) as client:
        response = await client.post("/v1/completions", json=request)
        assert response.status == 400 and (await response.json())["error"]["param"] == "prompt"
    assert not backend.requests


def test_the_authorization_scheme_is_case_insensitive():
    """Row 9: `bearer k` was a 401."""
    assert bearer_token("bearer k") == bearer_token("BEARER  k") == bearer_token("Bearer k") == "k"
    assert bearer_token("Basic k") is None and bearer_token("bearer ") is None


async def test_a_non_json_content_type_is_415():
    """Row 9: Content-Type text/plain was a 200."""
    status, body, backend = await _post(
        None, data=b'{"model": "echo-1", "prompt": "a"}', headers={"Content-Type": "text/plain"}
    )
    assert status == 415 and "application/json" in body["error"]["message"]
    assert not backend.requests


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"stop": ["x" * 1_000_000]}, "at most 256 characters"),
        ({"stop_token_ids": list(range(5000))}, "at most 64 ids"),
        ({"stop": ["a", ""]}, "must not be empty"),
    ],
)
async def test_stop_strings_and_stop_token_ids_are_bounded(fields, words):
    """Row 9: a 1 MB stop string and thousands of stop_token_ids were 200."""
    status, body, backend = await _post(_chat(**fields))
    assert status == 400 and words in body["error"]["message"]
    assert body["error"]["param"] == next(iter(fields)) and not backend.requests
