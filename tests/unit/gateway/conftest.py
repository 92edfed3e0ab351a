from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp.test_utils import TestClient, TestServer

from layerserve.gateway.v1 import gateway_pb2_grpc
from services.gateway.api_keys import KeyLimits, load_key_ring
from services.gateway.front_door import FrontDoor
from services.gateway.grpc_api import GatewayServicer, public_server
from services.gateway.http_app import create_app
from services.gateway.request_limits import DEFAULT_LIMITS, RequestLimits
from services.gateway.responses_store import ResponseStore
from tests.unit.gateway.echo_backend import EchoBackend
from tests.unit.gateway.scripted_backend import ScriptedBackend

API_KEY = "sk-test-key"
OTHER_KEY = "sk-other-key"


def front_door(*keys: str, limits: KeyLimits | None = None, max_inflight: int = 0) -> FrontDoor:
    """A front door admitting these plain keys, each with these limits (default: none)."""
    ring = load_key_ring(list(keys), None, limits or KeyLimits())
    return FrontDoor(ring, max_inflight=max_inflight)


@asynccontextmanager
async def grpc_gateway(
    servicer: GatewayServicer, limits: RequestLimits = DEFAULT_LIMITS
) -> AsyncIterator[str]:
    """The public gRPC server (grpc_api.public_server) serving `servicer` on a free loopback
    port, for the block; yields its address."""
    server = public_server(limits, [])
    gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


@pytest.fixture
def backend() -> EchoBackend:
    return EchoBackend()


@pytest.fixture
async def client(backend: EchoBackend) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(create_app(backend))) as test_client:
        yield test_client


@pytest.fixture
async def auth_client(backend: EchoBackend) -> AsyncIterator[TestClient]:
    app = create_app(backend, front_door=front_door(API_KEY))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


@pytest.fixture
def scripted() -> ScriptedBackend:
    return ScriptedBackend()


@pytest.fixture
async def http(scripted: ScriptedBackend) -> AsyncIterator[TestClient]:
    """A gateway over the scripted backend, with two keys (API_KEY, OTHER_KEY)."""
    app = create_app(scripted, front_door=front_door(API_KEY, OTHER_KEY), responses=ResponseStore())
    async with TestClient(TestServer(app)) as client:
        yield client
