"""Workers that register themselves (`--register-with`), as Kubernetes pods do
(deploy/k8s): the scheduler starts with none, routes to each one as it arrives, forgets it
when it leaves on SIGTERM, and learns of a new one, all without a restart; a scheduler that
restarts (and so forgets its workers) gets them back at their next heartbeat."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.scheduler.v1 import admin_pb2
from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack
from tests.e2e.helpers import AUTH, sse_events
from tests.e2e.multi_model import Admin, complete, eventually, stop_process

pytestmark = pytest.mark.e2e

ADMIN_KEY = "registration-admin-key"
LONG = 2000  # tokens: a request still running a few seconds after its first token


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,  # the plumbing is under test, not the model
        worker_registration=True,
        worker_args=["--register-heartbeat-s", "0.5"],
        log_dir=Path(tmp_path_factory.mktemp("registration-logs")),
        env={"LAYERSERVE_API_KEYS": API_KEY, "LAYERSERVE_ADMIN_KEY": ADMIN_KEY},
        redis="off",
    )
    s = start_stack(config)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def admin(stack: Stack) -> Iterator[Admin]:
    client = Admin(stack.config.scheduler_port, ADMIN_KEY)
    yield client
    client.close()


@pytest.fixture(scope="module")
def processes(stack: Stack) -> Iterator[list[subprocess.Popen]]:
    """Processes the tests start besides the stack's (the restarted scheduler lives on into
    the next test), stopped before the stack."""
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        stop_process(proc)


def start_registering_worker(stack: Stack, port: int, log: Path) -> subprocess.Popen:
    """A null worker that registers itself with the stack's scheduler, the key from the env."""
    args = ["--null", "--port", str(port), "--model-name", MODEL]
    args += ["--register-with", f"127.0.0.1:{stack.config.scheduler_port}"]
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.worker", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LAYERSERVE_ADMIN_KEY": ADMIN_KEY},
            start_new_session=True,
        )


def test_a_restarted_scheduler_gets_its_worker_back(
    stack: Stack, admin: Admin, processes: list[subprocess.Popen], tmp_path: Path
) -> None:
    (port,) = stack.config.worker_ports
    assert list(admin.workers()) == [f"127.0.0.1:{port}"]
    stack.kill("scheduler")  # SIGKILL: no drain, its worker list is lost
    args = ["--port", str(stack.config.scheduler_port), "--worker-registration"]
    with open(tmp_path / "scheduler.log", "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "services.scheduler", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "LAYERSERVE_ADMIN_KEY": ADMIN_KEY},
            start_new_session=True,
        )
    processes.append(proc)
    eventually(lambda: _listed(admin) == [f"127.0.0.1:{port}"], timeout=30)
    eventually(lambda: complete(stack, MODEL, "Hello").status_code == 200, timeout=30)


def _listed(admin: Admin) -> list[str] | None:
    """The scheduler's workers; None while it does not answer (starting)."""
    try:
        return list(admin.workers())
    except grpc.RpcError:
        return None


def test_workers_come_and_go_without_a_scheduler_restart(
    stack: Stack, admin: Admin, processes: list[subprocess.Popen], tmp_path: Path
) -> None:
    (port,) = stack.config.worker_ports
    first = f"127.0.0.1:{port}"
    # The scheduler was started with no --worker: it knows this one because it registered.
    assert list(admin.workers()) == [first]
    # Adding it again (a heartbeat racing another) answers its status, changes nothing.
    again = admin.call("AddWorker", admin_pb2.AddWorkerRequest(address=first))
    assert (again.address, again.state) == (first, admin_pb2.WORKER_STATE_READY)
    assert list(admin.workers()) == [first]
    assert complete(stack, MODEL, "Hello").status_code == 200

    # SIGTERM while a request runs there: the scheduler drains the worker (no new requests)
    # and the request finishes before the worker leaves.
    worker = stack.procs["worker0"]
    body = {"model": MODEL, "prompt": "Go on:", "max_tokens": LONG, "ignore_eos": True}
    url = f"{stack.http_url}/v1/completions"
    with httpx.stream("POST", url, json={**body, "stream": True}, headers=AUTH) as response:
        events = sse_events(response)
        next(events)
        worker.send_signal(signal.SIGTERM)
        eventually(lambda: admin.workers()[first].state == admin_pb2.WORKER_STATE_DRAINING)
        rest = [e for e in events if isinstance(e, dict)]
    assert [e for e in rest if "error" in e] == []
    assert rest[-1]["choices"][0]["finish_reason"] == "length"
    assert worker.wait(timeout=30) == 0
    assert admin.workers() == {}  # it deregistered itself before exiting
    response = complete(stack, MODEL, "Hello")
    assert response.status_code == 503, response.text
    assert MODEL in response.json()["error"]["message"]

    (new_port,) = free_ports(1)
    second = f"127.0.0.1:{new_port}"
    processes.append(start_registering_worker(stack, new_port, tmp_path / "worker.log"))
    eventually(lambda: list(admin.workers()) == [second], timeout=60)
    response = complete(stack, MODEL, "Hello again")
    assert response.status_code == 200, response.text
