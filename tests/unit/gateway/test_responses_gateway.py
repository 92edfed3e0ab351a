"""The Responses and Anthropic Messages APIs take chat completions' way through the gateway:
the key's limits and token reservation, the latency and error metrics, the request's span."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import tracing
from services.gateway.api_keys import KeyLimits
from services.gateway.http_app import create_app
from tests.prometheus_text import Scrape
from tests.unit.gateway.conftest import front_door
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

AUTH = {"Authorization": "Bearer k"}
RESPONSES = ("/v1/responses", {"model": MODEL, "input": "one two three"})
MESSAGES = (
    "/v1/messages",
    {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "one two"}]},
)


async def scrape(client: TestClient) -> Scrape:
    return Scrape.parse(await (await client.get("/metrics")).text())


async def test_each_api_is_timed_and_its_errors_counted() -> None:
    app = create_app(EchoBackend(), front_door=front_door("k"))
    async with TestClient(TestServer(app)) as client:
        before = await scrape(client)
        for path, body in (RESPONSES, MESSAGES):
            assert (await client.post(path, json=body, headers=AUTH)).status == 200
            bad = await client.post(path, json={**body, "model": ""}, headers=AUTH)
            assert bad.status == 400
        after = await scrape(client)
    ttft = "layerserve:time_to_first_token_seconds_count"
    assert after.delta(before, ttft, model=MODEL) == 2
    errors = "layerserve:request_errors_total"
    assert after.delta(before, errors, code="invalid_argument") == 2


@pytest.mark.parametrize(("path", "body"), [RESPONSES, MESSAGES])
async def test_the_reservation_counts_the_requested_output(path, body) -> None:
    """A key allowed 60 tokens a minute cannot ask for 100 output tokens at once."""
    door = front_door("k", limits=KeyLimits(tokens_per_minute=60))
    cap = "max_output_tokens" if path == RESPONSES[0] else "max_tokens"
    big, small = {**body, cap: 100}, {**body, cap: 5}
    async with TestClient(TestServer(create_app(EchoBackend(), front_door=door))) as client:
        refused = await client.post(path, json=big, headers=AUTH)
        assert refused.status == 429
        error = await refused.json()
        assert error["error"]["type"] == "rate_limit_error"  # in either API's error shape
        assert ("type" in error) == (path == MESSAGES[0])  # Anthropic's: {"type": "error", ...}
        assert (await client.post(path, json=small, headers=AUTH)).status == 200


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider, "gateway")
    yield exporter
    tracing.shutdown_tracing()


async def test_each_api_request_is_one_traced_span(spans) -> None:
    app = create_app(EchoBackend())
    async with TestClient(TestServer(app)) as client:
        for path, body in (RESPONSES, MESSAGES):
            assert (await client.post(path, json=body)).status == 200
    names = [span.name for span in spans.get_finished_spans()]
    assert "POST /v1/responses" in names and "POST /v1/messages" in names
    served = [s for s in spans.get_finished_spans() if s.name == "POST /v1/responses"][0]
    assert served.attributes["http.response.status_code"] == 200
    assert served.attributes["gen_ai.request.model"] == MODEL
