"""The container health-check CLI (services/common/healthcheck.py) against a real in-process
gRPC server running the reference grpc.health.v1 servicer: its exit status is what docker
compose's depends_on waits on."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.healthcheck import main

WORKER = "layerserve.worker.v1.Worker"


@pytest.fixture
def served() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)


def _set(servicer: health.HealthServicer, service: str, status: str) -> None:
    servicer.set(service, health_pb2.HealthCheckResponse.ServingStatus.Value(status))


def test_serving_server_exits_0_and_says_so(served, capsys) -> None:
    address, servicer = served
    _set(servicer, "", "SERVING")
    assert main([address]) == 0
    assert "SERVING" in capsys.readouterr().out


def test_not_serving_exits_1(served, capsys) -> None:
    address, servicer = served
    _set(servicer, "", "NOT_SERVING")
    assert main([address]) == 1
    assert "NOT_SERVING" in capsys.readouterr().out


def test_service_flag_asks_for_that_service(served, capsys) -> None:
    address, servicer = served
    _set(servicer, "", "SERVING")
    _set(servicer, WORKER, "NOT_SERVING")
    assert main([address, "--service", WORKER]) == 1
    _set(servicer, WORKER, "SERVING")
    assert main([address, "--service", WORKER]) == 0
    # A service the server does not know is not healthy, whatever the server says overall.
    assert main([address, "--service", "layerserve.nope.v1.Nope"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().out


def test_nothing_listening_exits_1_without_waiting_out_the_timeout(capsys) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free once closed: nothing listens there
    started = time.monotonic()
    assert main([f"127.0.0.1:{port}", "--timeout", "60"]) == 1
    # Far below the 60 s timeout: a refused connection fails the check at once.
    assert time.monotonic() - started < 30
    assert "UNAVAILABLE" in capsys.readouterr().out


def test_runs_as_the_module_docker_compose_calls(served) -> None:
    address, servicer = served
    _set(servicer, "", "SERVING")
    command = [sys.executable, "-m", "services.common.healthcheck", address]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    _set(servicer, "", "NOT_SERVING")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "NOT_SERVING" in done.stdout
