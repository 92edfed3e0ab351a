"""The web console's routes: the page needs no key, its data does; the gateway's own spans
reach its trace ring through the OTLP receiver (with the internal token, refused without);
a key sees only its own requests' traces; prompts only when the operator logs them."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from layerserve.gateway.v1 import gateway_pb2, gateway_pb2_grpc
from services.common import tracing
from services.common.internal_auth import METADATA_KEY, InternalAuth
from services.common.tracing import setup_tracing
from services.gateway.console_routes import RING
from services.gateway.grpc_api import GatewayServicer
from services.gateway.http_app import BACKEND, FRONT_DOOR, create_app
from services.gateway.request_span import GRPC_GENERATE
from services.gateway.trace_receiver import start_receiver
from services.gateway.trace_ring import TraceRing
from services.launcher import console_env, parse_args
from tests.e2e.conftest import free_ports
from tests.unit.gateway.conftest import front_door, grpc_gateway
from tests.unit.gateway.echo_backend import MODEL, EchoBackend

TOKEN = secrets.token_hex(16)
PROMPT = "the quokka 4417 marmalade"


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def receiver_port(monkeypatch) -> int:
    (port,) = free_ports(1)
    monkeypatch.setenv("LAYERSERVE_TRACE_RECEIVER", f"127.0.0.1:{port}")
    monkeypatch.setenv("LAYERSERVE_INTERNAL_TOKEN", TOKEN)
    monkeypatch.delenv("LAYERSERVE_LOG_PROMPTS", raising=False)
    return port


@pytest.fixture
async def client(receiver_port: int) -> AsyncIterator[TestClient]:
    """A gateway with two keys whose spans go, as the other services' do, over OTLP/gRPC to
    its own receiver."""
    exporter = OTLPSpanExporter(
        endpoint=f"127.0.0.1:{receiver_port}", insecure=True, headers={METADATA_KEY: TOKEN}
    )
    provider = TracerProvider(resource=Resource.create({"service.name": "layerserve-gateway"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider, "gateway")
    app = create_app(EchoBackend(), front_door=front_door("key-a", "key-b"))
    try:
        async with TestClient(TestServer(app)) as test_client:
            yield test_client
    finally:
        tracing.shutdown_tracing()


async def chat(client: TestClient, key: str) -> str:
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3}
    response = await client.post("/v1/chat/completions", json=body, headers=auth(key))
    assert response.status == 200, await response.text()
    return response.headers["X-Request-Id"]


async def traces(client: TestClient, key: str, want: int = 0) -> list[dict]:
    for _ in range(100):
        response = await client.get("/console/api/traces", headers=auth(key))
        assert response.status == 200
        data = (await response.json())["data"]
        if len(data) >= want and all(t["num_spans"] for t in data):
            return data
        await asyncio.sleep(0.05)
    return data


async def test_the_page_needs_no_key_and_its_data_does(client):
    page = await client.get("/")
    assert page.status == 200 and "layerserve console" in await page.text()
    for asset in ("console.js", "timeline.js", "console.css"):
        assert (await client.get(f"/console/{asset}")).status == 200
    assert (await (await client.get("/console/session.json")).json()) == {"keys_required": True}
    for path in ("/console/api/traces", "/console/api/stack", "/console/api/info"):
        assert (await client.get(path)).status == 401
    assert (await client.get("/console/secret.py")).status in (401, 404)


async def test_a_key_sees_its_own_request_traced_and_no_other(client):
    request_id = await chat(client, "key-a")
    (mine,) = await traces(client, "key-a", want=1)
    assert mine["request_id"] == request_id
    assert mine["services"] == ["layerserve-gateway"] and mine["prompt"] == ""
    detail = await client.get(f"/console/api/traces/{mine['trace_id']}", headers=auth("key-a"))
    spans = (await detail.json())["spans"]
    assert {"POST /v1/chat/completions", "auth"} <= {s["name"] for s in spans}
    assert all(PROMPT not in str(s["attributes"]) for s in spans)
    assert await traces(client, "key-b") == []
    other = await client.get(f"/console/api/traces/{mine['trace_id']}", headers=auth("key-b"))
    assert other.status == 404
    assert "error" in await other.json()


async def test_a_grpc_call_is_listed_for_its_own_key_as_http_requests_are(client):
    """Issue 31: the public gRPC API's calls are in the Requests view too (they were not)."""
    app = client.app
    servicer = GatewayServicer(app[BACKEND], app[FRONT_DOOR], ring=app[RING])
    async with grpc_gateway(servicer) as address:
        async with grpc.aio.insecure_channel(address) as channel:
            request = gateway_pb2.GenerateRequest(model=MODEL, prompt=PROMPT, max_tokens=3)
            call = gateway_pb2_grpc.GatewayStub(channel).Generate(
                request, metadata=[("authorization", "Bearer key-a")]
            )
            assert [r async for r in call]
    (mine,) = await traces(client, "key-a", want=1)
    assert mine["request_id"].startswith("gen-") and mine["path"] == GRPC_GENERATE
    detail = await client.get(f"/console/api/traces/{mine['trace_id']}", headers=auth("key-a"))
    assert GRPC_GENERATE in {s["name"] for s in (await detail.json())["spans"]}
    assert await traces(client, "key-b") == []


async def test_prompts_show_only_when_the_operator_logs_them(client, monkeypatch):
    monkeypatch.setenv("LAYERSERVE_LOG_PROMPTS", "1")
    await chat(client, "key-b")
    (trace,) = await traces(client, "key-b", want=1)
    assert trace["prompt"] == PROMPT
    info = await (await client.get("/console/api/info", headers=auth("key-b"))).json()
    assert info["prompts"] is True and info["ring"] is True and info["key"]


async def test_the_receiver_refuses_spans_without_the_internal_token(client, receiver_port):
    ring = client.server.app[RING]
    before = ring.num_spans
    request = trace_service_pb2.ExportTraceServiceRequest()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{receiver_port}") as channel:
        stub = trace_service_pb2_grpc.TraceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.Export(request, metadata=((METADATA_KEY, "x" * 32),))
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await stub.Export(request, metadata=((METADATA_KEY, TOKEN),))
    assert ring.num_spans == before


async def test_the_stack_panel_shows_a_key_its_own_requests_in_flight(client):
    async def stack(key: str) -> dict:
        response = await client.get("/console/api/stack", headers=auth(key))
        assert response.status == 200
        return await response.json()

    body = {"model": MODEL, "prompt": "slow " * 40, "max_tokens": 40, "stream": True}
    client.server.app[BACKEND].token_delay = 0.05  # 2 s of streaming
    response = await client.post("/v1/completions", json=body, headers=auth("key-a"))
    await response.content.readline()  # the first event: the answer has started
    mine = (await stack("key-a"))["yours"]
    assert [r["request_id"] for r in mine] == [response.headers["X-Request-Id"]]
    theirs = await stack("key-b")
    assert theirs["yours"] == [] and theirs["schedulers"] == []  # no scheduler address given
    assert theirs["gateway"]["requests_in_flight"] == 1
    response.close()


def test_make_run_sends_traces_to_the_console_unless_the_operator_has_a_collector():
    config = parse_args(["--internal-port-base", "41000", "--schedulers", "2"])
    env = console_env({}, config)
    assert env["LAYERSERVE_TRACE_RECEIVER"] == "127.0.0.1:40999"
    assert env["LAYERSERVE_SCHEDULER_ADDRESS"] == "127.0.0.1:41001,127.0.0.1:41002"
    collector = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://jaeger:4317"}
    assert "LAYERSERVE_TRACE_RECEIVER" not in console_env(collector, config)


def test_only_the_consoles_own_receiver_is_sent_the_internal_token(monkeypatch, receiver_port):
    ring = TraceRing()
    start_receiver(f"127.0.0.1:{receiver_port}", ring, InternalAuth(TOKEN))

    def export_one_span() -> None:
        assert setup_tracing("scheduler")
        tracing.finish(tracing.start_span("engine step", {}))
        tracing.shutdown_tracing()  # flushes

    # Named as the operator's collector, it gets the spans without the token: refused here.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{receiver_port}")
    export_one_span()
    assert ring.num_spans == 0
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")  # LAYERSERVE_TRACE_RECEIVER alone
    export_one_span()
    assert ring.num_spans == 1


def test_a_service_stops_without_waiting_on_a_console_that_is_gone(receiver_port: int):
    """A stop ends the gateway (the console's receiver) first: the others' last spans have
    nowhere to go, and each service's exit waited the exporter's 10 s of retries for them."""
    assert setup_tracing("scheduler")  # nothing listens on receiver_port
    tracing.finish(tracing.start_span("engine step", {}))
    started = time.monotonic()
    tracing.shutdown_tracing()
    assert time.monotonic() - started < 5 * tracing.CONSOLE_EXPORT_TIMEOUT_S
