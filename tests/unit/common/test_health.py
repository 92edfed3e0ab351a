"""grpc.health.v1 as a server reports it (services/common/health.py) and the drain gate in
front of it (drain_gate.py): on a real in-process gRPC server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.drain_gate import DrainGate
from services.common.grpc_util import new_channel, new_server
from services.common.health import NOT_SERVING, SERVING, Health, service_name

WORKER = service_name(worker_pb2, "Worker")
ALWAYS = "layerserve.test.v1.Always"


class SlowWorker(worker_pb2_grpc.WorkerServicer):
    """Execute answers each step after `release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def Describe(self, request, context) -> worker_pb2.WorkerInfo:
        return worker_pb2.WorkerInfo(model="m")

    async def Execute(self, request_iterator, context) -> AsyncIterator[worker_pb2.StepResult]:
        async for msg in request_iterator:
            await self.release.wait()
            yield worker_pb2.StepResult(step_id=msg.step_id)


class Served:
    def __init__(self) -> None:
        self.problem: str | None = "warming up"
        self.gate = DrainGate("the test server")
        self.server = new_server([self.gate])
        self.worker = SlowWorker()
        worker_pb2_grpc.add_WorkerServicer_to_server(self.worker, self.server)
        self.health = Health([WORKER], lambda: self.problem, always=[ALWAYS], interval=0.01)
        self.health.add_to(self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.channel = new_channel(f"127.0.0.1:{port}")
        self.health_stub = health_pb2_grpc.HealthStub(self.channel)
        self.worker_stub = worker_pb2_grpc.WorkerStub(self.channel)

    async def status(self, service: str) -> int:
        request = health_pb2.HealthCheckRequest(service=service)
        return (await self.health_stub.Check(request, timeout=5)).status

    async def wait_status(self, service: str, status: int) -> None:
        for _ in range(500):
            if await self.status(service) == status:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{service!r} never reached {status}")


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    s = Served()
    s.health.start()
    await s.server.start()
    yield s
    await s.channel.close()
    await s.server.stop(None)


async def test_not_serving_until_the_check_passes_for_the_service_and_overall(served: Served):
    assert await served.status(WORKER) == NOT_SERVING
    assert await served.status("") == NOT_SERVING
    assert await served.status(ALWAYS) == SERVING
    served.problem = None
    await served.wait_status(WORKER, SERVING)
    assert await served.status("") == SERVING
    served.problem = "the engine step has not returned"
    await served.wait_status(WORKER, NOT_SERVING)


async def test_an_unknown_service_is_not_found(served: Served):
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.status("layerserve.nothing.v1.Nothing")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_follows_changes_and_ends_on_drain(served: Served):
    call = served.health_stub.Watch(health_pb2.HealthCheckRequest(service=WORKER))
    assert (await call.read()).status == NOT_SERVING
    served.problem = None
    assert (await call.read()).status == SERVING
    served.health.drain()
    assert (await call.read()).status == NOT_SERVING
    assert await call.read() is grpc.aio.EOF  # the watch does not hold the server open
    assert await call.code() == grpc.StatusCode.OK
    served.problem = None
    await asyncio.sleep(0.05)
    assert await served.status(WORKER) == NOT_SERVING  # for good
    assert await served.status(ALWAYS) == NOT_SERVING


async def test_a_closed_gate_refuses_new_rpcs_but_lets_running_ones_finish(served: Served):
    step = served.worker_stub.Execute()
    await step.write(worker_pb2.StepRequest(step_id=1))
    for _ in range(500):
        if served.gate.in_flight == 1:
            break
        await asyncio.sleep(0.01)
    assert served.gate.in_flight == 1
    served.gate.close()
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await served.worker_stub.Describe(worker_pb2.DescribeRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in err.value.details()
    refused = served.worker_stub.Execute()
    with contextlib.suppress(grpc.aio.AioRpcError):  # the call may have ended already
        await refused.write(worker_pb2.StepRequest(step_id=9))
    assert await refused.code() == grpc.StatusCode.UNAVAILABLE
    assert "shutting down" in await refused.details()
    assert await served.status(ALWAYS) == SERVING  # health checks pass the gate
    served.worker.release.set()
    assert (await step.read()).step_id == 1  # the stream in progress goes on
    await step.done_writing()
    assert await step.read() is grpc.aio.EOF
    for _ in range(500):
        if served.gate.in_flight == 0:
            break
        await asyncio.sleep(0.01)
    assert served.gate.in_flight == 0
