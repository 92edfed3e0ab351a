"""A stack of its own for the bad-input tests: a null worker (fake tokens, no model), so it
starts in seconds and fuzzing costs plumbing only. Never the shared e2e stack: a crash found
here must not take other tests down with it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.stack import Stack
from tests.e2e.conftest import loopback_config, start_stack

API_KEY = "reliability-test-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
MODEL = "smollm2-135m-instruct"  # the null worker serves it under this name, without weights


@pytest.fixture(scope="session")
def null_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    log_dir = Path(tmp_path_factory.mktemp("reliability-logs"))
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        worker_args=["--num-blocks", "256"],
        log_dir=log_dir,
        env={"LAYERSERVE_API_KEYS": API_KEY},
        redis="off",
        ready_timeout=120,
    )
    stack = start_stack(config)
    yield stack
    try:
        stack.check_alive()  # every service must have survived everything thrown at it
    finally:
        stack.stop()
        _print_logs(log_dir, only_errors=True)


def _print_logs(log_dir: Path, only_errors: bool = False) -> None:
    for log in sorted(log_dir.glob("*.log")):
        text = log.read_text(errors="replace")
        if not only_errors or "Traceback" in text:
            print(f"--- {log.name}\n{text[-4000:]}")


def serves_normally(stack: Stack) -> None:
    """The stack still answers an ordinary request correctly."""
    stack.check_alive()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    response = httpx.post(
        f"{stack.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


@pytest.fixture(scope="session")
def scheduler_stub(null_stack: Stack) -> Iterator[scheduler_pb2_grpc.SchedulerStub]:
    with grpc.insecure_channel(f"127.0.0.1:{null_stack.config.scheduler_port}") as channel:
        yield scheduler_pb2_grpc.SchedulerStub(channel)


def worker_stats(stub: scheduler_pb2_grpc.SchedulerStub) -> scheduler_pb2.WorkerStats:
    return stub.GetStats(scheduler_pb2.GetStatsRequest(model=MODEL), timeout=10).workers[0]
