"""Helpers for the multi-model end-to-end tests: the stack's config, admin calls, extra
worker processes started while the stack runs."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import grpc
import httpx

from layerserve.scheduler.v1 import admin_pb2, admin_pb2_grpc, scheduler_pb2, scheduler_pb2_grpc
from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL

T = TypeVar("T")

TINY = "tiny-llama"
ADMIN_KEY = "e2e-admin-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ALIASES = f"""
[aliases.canary]
weights = {{ "{MODEL}" = 90, "{TINY}" = 10 }}

[aliases.auto]
by_prompt_length = [{{ max_prompt_tokens = 8, model = "{TINY}" }}, {{ model = "{MODEL}" }}]
"""


def complete(stack: Stack, model: str, prompt: str | list[int], **extra) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0, **extra}
    return httpx.post(f"{stack.http_url}/v1/completions", json=body, headers=AUTH, timeout=120)


def served_by(stack: Stack, model: str, prompt: str | list[int]) -> str:
    response = complete(stack, model, prompt, max_tokens=1)
    assert response.status_code == 200, response.text
    return response.json()["model"]


class Admin:
    """The scheduler's Admin API, with the key (or another one)."""

    def __init__(self, port: int, key: str | None = ADMIN_KEY) -> None:
        self._channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = admin_pb2_grpc.AdminStub(self._channel)
        self.scheduler = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self.metadata = [("authorization", f"Bearer {key}")] if key else []

    def wait_ready(self, timeout: float) -> None:
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def call(self, method: str, request, timeout: float = 150):
        return getattr(self.stub, method)(request, metadata=self.metadata, timeout=timeout)

    def workers(self) -> dict[str, admin_pb2.WorkerStatus]:
        return {
            w.address: w for w in self.call("ListWorkers", admin_pb2.ListWorkersRequest()).workers
        }

    def steps(self, address: str) -> int:
        stats = self.scheduler.GetStats(scheduler_pb2.GetStatsRequest(), timeout=5)
        return next(w.steps for w in stats.workers if w.address == address)

    def close(self) -> None:
        self._channel.close()


def start_worker(port: int, name: str, path: Path, log: Path) -> subprocess.Popen:
    args = ["--port", str(port), "--model-name", name, "--model-path", str(path)]
    with open(log, "w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "services.worker", *args, "--num-blocks", "256"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_process(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def eventually(check: Callable[[], T], timeout: float = 30.0) -> T:
    """The first truthy result of `check`, polled until `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (result := check()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{check} stayed false for {timeout}s")
        time.sleep(0.1)
    return result
