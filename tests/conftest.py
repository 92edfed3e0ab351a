"""Fixtures shared by every test directory."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

# Triton reads TRITON_INTERPRET when a kernel is decorated (at import), so it is set before any
# test module can import one: without an NVIDIA GPU, kernels run in Triton's interpreter. Worker
# processes the tests start inherit it, harmless: they run torch ops on the CPU unless forced.
if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

from tests.redis_server import RedisServer  # noqa: E402

pytest_plugins = ["tests.failure_rendering"]


def pytest_addoption(parser: pytest.Parser) -> None:
    # Here, not in tests/reliability/conftest.py: options of a sub-directory's conftest are
    # unknown when pytest is started without a path inside it.
    parser.addoption(
        "--soak-seconds",
        type=float,
        default=None,
        help="how long tests/reliability/test_soak.py runs (default: LAYERSERVE_SOAK_SECONDS, "
        "else 30)",
    )


@pytest.fixture(autouse=True)
def _main_thread_event_loop() -> Iterator[None]:
    """asyncio.run() ends by unsetting the thread's event loop, and grpc.aio channels and
    servers built outside a coroutine (as several tests do) then fail with "There is no
    current event loop": each test finds a loop set, whichever test ran before it."""
    try:
        asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        asyncio.set_event_loop(asyncio.new_event_loop())
    yield


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama checkpoint on disk (tests/e2e/tiny_llama.py), written once: 4
    attention heads, 2 KV heads, 112 MLP columns, so tensor parallelism of 2 splits it."""
    from tests.e2e.tiny_llama import write_tiny_llama

    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


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
