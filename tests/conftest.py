"""Fixtures shared by every test directory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real redis-server for the whole session (tests isolate by key namespace)."""
    server = RedisServer()
    server.start()
    yield server.url
    server.stop()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test's own, which the test may kill or restart."""
    server = RedisServer()
    server.start()
    yield server
    server.stop()
