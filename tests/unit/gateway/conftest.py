from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from services.gateway.http_app import create_app
from tests.unit.gateway.echo_backend import EchoBackend

API_KEY = "sk-test-key"


@pytest.fixture
def backend() -> EchoBackend:
    return EchoBackend()


@pytest.fixture
async def client(backend: EchoBackend) -> AsyncIterator[TestClient]:
    async with TestClient(TestServer(create_app(backend, api_keys=None))) as test_client:
        yield test_client


@pytest.fixture
async def auth_client(backend: EchoBackend) -> AsyncIterator[TestClient]:
    app = create_app(backend, api_keys=frozenset({API_KEY}))
    async with TestClient(TestServer(app)) as test_client:
        yield test_client
