"""A worker with several schedulers: it waits a moment for its home at start-up, registers
with a fallback while home does not answer, and goes back home (drained from the fallback
first) once home answers again."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from layerserve.scheduler.v1 import admin_pb2
from services.worker.serving import registration
from services.worker.serving.registration import Registration

ME = "10.0.0.9:50061"


class Admin:
    """One scheduler's Admin API: up or down, and the workers it has."""

    def __init__(self, name: str, calls: list[tuple[str, str]]) -> None:
        self.name = name
        self.up = False
        self.workers: set[str] = set()
        self.calls = calls

    def _check(self, method: str) -> None:
        self.calls.append((self.name, method))
        if not self.up:
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down"
            )

    async def ListWorkers(self, request, **_):
        self._check("list")
        return admin_pb2.ListWorkersResponse(
            workers=[admin_pb2.WorkerStatus(address=a) for a in sorted(self.workers)]
        )

    async def AddWorker(self, request, **_):
        self._check("add")
        self.workers.add(request.address)
        return admin_pb2.WorkerStatus(address=request.address, model="m")

    async def RemoveWorker(self, request, **_):
        self._check("remove")
        self.workers.discard(request.address)
        return admin_pb2.RemoveWorkerResponse()


async def until(check, seconds: float = 5.0) -> None:
    for _ in range(int(seconds / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not within the time")


async def test_fallback_while_home_is_away_then_home_again(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(registration, "FIRST_BACKOFF_S", 0.01)
    calls: list[tuple[str, str]] = []
    reg = Registration("home:1,other:1", ME, "key", heartbeat_s=0.02)
    home, other = Admin("home", calls), Admin("other", calls)
    reg._admins = {"home:1": home, "other:1": other}
    other.up = True
    reg.start()
    await until(lambda: ME in other.workers)
    # It tried home first, a few times (seconds at real backoffs), before taking the fallback.
    first_other = next(i for i, (name, _) in enumerate(calls) if name == "other")
    assert first_other >= 3 and set(calls[:first_other]) == {("home", "list")}
    home.up = True
    await until(lambda: ME in home.workers)
    assert ME not in other.workers  # drained from the fallback before going home
    assert calls.index(("other", "remove")) < calls.index(("home", "add"))
    home.up = False  # home lost: the next heartbeat moves it to the fallback at once
    await until(lambda: ME in other.workers, 1.0)
    await reg.deregister(0.1)
    assert ME not in other.workers
