"""The gateway's GET /metrics as an operator reads it: latencies as the client sees them (with
the trace id of a traced request as an exemplar), 429s told apart by cause, errors by the code
the client got, requests in flight."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import TracerProvider

from services.common import tracing
from services.gateway.api_keys import KeyLimits
from services.gateway.http_app import create_app
from tests.prometheus_text import OPENMETRICS, Scrape
from tests.unit.gateway.conftest import front_door
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

TTFT = "layerserve:time_to_first_token_seconds"
TPOT = "layerserve:time_per_output_token_seconds"
ITL = "layerserve:inter_token_latency_seconds"
E2E = "layerserve:e2e_request_latency_seconds"
ERRORS = "layerserve:request_errors_total"
REJECTED = "layerserve:rate_limit_rejections_total"
IN_FLIGHT = "layerserve:requests_in_flight"
BODY = {"model": MODEL, "prompt": "one two three", "max_tokens": 3}
DELAY = 0.05  # seconds before each token of the echo backend
AT_LEAST = 0.9 * DELAY  # a timer may fire a hair early


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def scrape(client: TestClient) -> Scrape:
    response = await client.get("/metrics")  # no key: Prometheus scrapes without one
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/plain")
    return Scrape.parse(await response.text())


async def test_each_choice_is_timed_from_admission_as_the_client_sees_it():
    backend = EchoBackend(token_delay=DELAY)
    app = create_app(backend, front_door=front_door("k"))
    async with TestClient(TestServer(app)) as client:
        before = await scrape(client)
        plain = await client.post("/v1/completions", json=BODY, headers=auth("k"))
        assert plain.status == 200
        streamed = await client.post(
            "/v1/completions", json={**BODY, "stream": True, "n": 2}, headers=auth("k")
        )
        assert (await streamed.read()).endswith(b"data: [DONE]\n\n")
        after = await scrape(client)
    # Three choices (one, then n=2), each with three tokens, DELAY before each.
    for name in (TTFT, TPOT, E2E):
        assert after.delta(before, name + "_count", model=MODEL) == 3, name
    assert after.delta(before, TTFT + "_sum", model=MODEL) >= 3 * AT_LEAST
    assert after.delta(before, TPOT + "_sum", model=MODEL) >= 3 * AT_LEAST
    assert after.delta(before, E2E + "_sum", model=MODEL) >= 3 * 3 * AT_LEAST
    # Every gap between two tokens: two per choice.
    assert after.delta(before, ITL + "_count", model=MODEL) == 3 * 2
    assert after.delta(before, ITL + "_sum", model=MODEL) >= 3 * 2 * AT_LEAST
    success = "layerserve:request_success_total"
    assert after.delta(before, success, model=MODEL, finished_reason="stop") == 3
    assert after.delta(before, ERRORS) == 0


async def test_429s_count_as_rate_limit_rejections_only_when_a_key_is_over_its_limit():
    door = front_door("k", limits=KeyLimits(requests_per_minute=1))
    async with TestClient(TestServer(create_app(EchoBackend(), front_door=door))) as client:
        before = await scrape(client)
        assert (await client.post("/v1/completions", json=BODY, headers=auth("k"))).status == 200
        assert (await client.post("/v1/completions", json=BODY, headers=auth("k"))).status == 429
        after = await scrape(client)
    assert after.delta(before, REJECTED, limit="rate") == 1
    assert after.delta(before, ERRORS, code="resource_exhausted") == 1

    # A full queue behind the gateway is a 429 too, but no key is over a limit.
    async with TestClient(TestServer(create_app(EchoBackend()))) as client:
        before = await scrape(client)
        busy = {**BODY, "prompt": "busy queue"}
        assert (await client.post("/v1/completions", json=busy)).status == 429
        after = await scrape(client)
    assert after.delta(before, REJECTED) == 0
    assert after.delta(before, ERRORS, code="resource_exhausted") == 1


async def test_a_key_over_its_concurrency_is_a_rejection_and_in_flight_requests_are_shown():
    door = front_door("k", limits=KeyLimits(max_concurrent=1))
    backend = EchoBackend(token_delay=0.2)
    async with TestClient(TestServer(create_app(backend, front_door=door))) as client:
        before = await scrape(client)
        slow = asyncio.ensure_future(
            client.post("/v1/completions", json={**BODY, "stream": True}, headers=auth("k"))
        )
        while not backend.requests:
            await asyncio.sleep(0.01)
        during = await scrape(client)
        assert (await client.post("/v1/completions", json=BODY, headers=auth("k"))).status == 429
        await (await slow).read()
        after = await scrape(client)
    assert during.delta(before, IN_FLIGHT) == 1
    assert after.delta(before, IN_FLIGHT) == 0
    assert after.delta(before, REJECTED, limit="concurrent") == 1


async def test_errors_are_counted_by_the_code_the_client_got():
    app = create_app(EchoBackend(token_delay=0.01), front_door=front_door("k"))
    async with TestClient(TestServer(app)) as client:
        before = await scrape(client)
        post = client.post
        assert (await post("/v1/completions", json=BODY, headers=auth("bad"))).status == 401
        unknown = {**BODY, "model": "nope"}
        assert (await post("/v1/completions", json=unknown, headers=auth("k"))).status == 404
        bad = {**BODY, "max_tokens": -1}
        assert (await post("/v1/completions", json=bad, headers=auth("k"))).status == 400
        assert (await client.get("/v1/nowhere", headers=auth("k"))).status == 404
        # After the 200: an error event inside the stream.
        boom = {**BODY, "prompt": "fine then boom", "stream": True}
        response = await post("/v1/completions", json=boom, headers=auth("k"))
        assert response.status == 200 and b"unavailable" in await response.read()
        # Probes and scrapes are not requests: a 200 or 503 there is never counted.
        assert (await client.get("/health")).status == 200
        after = await scrape(client)
    codes = {"unauthenticated": 1, "not_found": 2, "invalid_argument": 1, "unavailable": 1}
    for code, count in codes.items():
        assert after.delta(before, ERRORS, code=code) == count, code
    assert after.delta(before, ERRORS) == sum(codes.values())


async def test_a_client_that_hangs_up_is_counted_as_cancelled():
    backend = EchoBackend(token_delay=0.2)
    async with TestClient(TestServer(create_app(backend))) as client:
        before = await scrape(client)
        request = asyncio.ensure_future(client.post("/v1/completions", json=BODY))
        while not backend.requests:
            await asyncio.sleep(0.01)
        request.cancel()  # the client closes its connection before the answer
        while not backend.aborted:
            await asyncio.sleep(0.01)
        for _ in range(100):  # the handler's cancellation lands a moment after the abort
            after = await scrape(client)
            if after.delta(before, ERRORS, code="cancelled"):
                break
            await asyncio.sleep(0.02)
    assert after.delta(before, ERRORS, code="cancelled") == 1
    assert after.delta(before, E2E + "_count") == 0


@pytest.fixture
def traced() -> Iterator[None]:
    tracing.install(TracerProvider(), "gateway")  # spans built and dropped
    yield
    tracing.shutdown_tracing()


async def test_a_traced_request_is_an_exemplar_of_its_latencies_in_openmetrics(traced):
    trace_id = secrets.token_hex(16)
    headers = {**auth("k"), "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01"}
    app = create_app(EchoBackend(token_delay=0.001), front_door=front_door("k"))
    async with TestClient(TestServer(app)) as client:
        body = {**BODY, "stream": True}
        streamed = await client.post("/v1/completions", json=body, headers=headers)
        assert (await streamed.read()).endswith(b"data: [DONE]\n\n")
        response = await client.get("/metrics", headers={"Accept": OPENMETRICS})
        assert response.headers["Content-Type"].startswith("application/openmetrics-text")
        page = Scrape.parse(await response.text(), openmetrics=True)
    for name in (TTFT, ITL, E2E):
        found = {
            e.labels["trace_id"] for (n, _), e in page.exemplars.items() if n == name + "_bucket"
        }
        assert trace_id in found, name
    assert not any(
        n.startswith("layerserve_") for n in page.names
    )  # the names as Prometheus stores them
