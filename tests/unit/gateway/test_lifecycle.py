"""The gateway's readiness (/ready, a cached probe of its tokenizer service) and drain (new
requests refused with 503, those in progress left to finish), on the real aiohttp app."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.gateway.http_app import create_app
from services.gateway.lifecycle import Lifecycle
from tests.unit.gateway.conftest import API_KEY, front_door
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

AUTH = {"Authorization": f"Bearer {API_KEY}"}


class Probe:
    def __init__(self) -> None:
        self.answer: str | None = "the tokenizer service is unreachable (UNAVAILABLE)"
        self.calls = 0

    async def __call__(self) -> str | None:
        self.calls += 1
        await asyncio.sleep(0.01)
        return self.answer


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def probe() -> Probe:
    return Probe()


@pytest.fixture
def lifecycle(probe: Probe) -> Lifecycle:
    return Lifecycle(probe, cache_s=1.0, clock=FakeClock())


@pytest.fixture
async def client(lifecycle: Lifecycle) -> AsyncIterator[TestClient]:
    backend = EchoBackend(token_delay=0.02)
    app = create_app(backend, front_door=front_door(API_KEY), lifecycle=lifecycle)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


async def test_probes_are_cached_and_shared(lifecycle: Lifecycle, probe: Probe):
    answers = await asyncio.gather(*(lifecycle.problem() for _ in range(5)))
    assert answers == [probe.answer] * 5 and probe.calls == 1
    probe.answer = None
    assert await lifecycle.problem() is not None  # still the cached answer
    lifecycle._clock.now += 1.5
    assert await lifecycle.problem() is None
    assert probe.calls == 2


async def test_ready_is_503_naming_the_dependency_then_200_without_a_key(
    client: TestClient, lifecycle: Lifecycle, probe: Probe
):
    response = await client.get("/ready")
    assert response.status == 503
    error = (await response.json())["error"]
    assert "tokenizer service" in error["message"] and error["type"]
    probe.answer = None
    lifecycle._clock.now += 2
    response = await client.get("/ready")
    assert response.status == 200
    assert (await client.get("/health")).status == 200


async def test_a_drain_refuses_new_requests_and_lets_running_ones_finish(
    client: TestClient, lifecycle: Lifecycle, probe: Probe
):
    probe.answer = None
    body = {"model": MODEL, "prompt": "one two three four five six", "stream": True}
    running = await client.post("/v1/completions", json=body, headers=AUTH)
    assert running.status == 200
    assert lifecycle.in_flight == 1
    lifecycle.begin_drain()
    refused = await client.post("/v1/completions", json=body, headers=AUTH)
    assert refused.status == 503
    assert refused.headers["Retry-After"]
    assert "shutting down" in (await refused.json())["error"]["message"]
    assert (await client.get("/ready")).status == 503
    assert (await client.get("/health")).status == 200  # alive while it drains
    text = await running.text()  # the stream in progress runs to its end
    assert '"finish_reason":"stop"' in text and text.rstrip().endswith("data: [DONE]")
    assert lifecycle.in_flight == 0
