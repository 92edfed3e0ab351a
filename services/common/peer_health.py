"""A peer's health as this process sees it: a grpc.health.v1 Watch stream, reopened when it
breaks. The scheduler follows each worker this way, the tokenizer its scheduler: a change
(a worker that hangs, drains or dies) is known at once, without polling."""

from __future__ import annotations

import asyncio
import logging

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
RETRY_SECONDS = 0.5


class PeerHealth:
    def __init__(self, channel: grpc.aio.Channel, service: str, peer: str) -> None:
        self._stub = health_pb2_grpc.HealthStub(channel)
        self._service = service
        self._peer = peer
        self.serving = False
        self.reason = f"{peer}: not reached yet"  # why it is not serving
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        request = health_pb2.HealthCheckRequest(service=self._service)
        while True:
            try:
                # wait_for_ready: while the peer is down the call waits for it, not spins.
                async for response in self._stub.Watch(request, wait_for_ready=True):
                    self._set(response.status)
                self._lost("it ended its health stream (shutting down?)")
            except grpc.aio.AioRpcError as err:
                self._lost(f"unreachable ({err.code().name})")
            await asyncio.sleep(RETRY_SECONDS)

    def _set(self, status: int) -> None:
        serving = status == SERVING
        if serving and not self.serving:
            log.info("%s is serving", self._peer)
        elif not serving and self.serving:
            log.warning("%s stopped serving (%s)", self._peer, _status_name(status))
        self.serving = serving
        self.reason = f"{self._peer} is {_status_name(status)}"

    def _lost(self, why: str) -> None:
        if self.serving:
            log.warning("%s: %s", self._peer, why)
        self.serving = False
        self.reason = f"{self._peer}: {why}"


def _status_name(status: int) -> str:
    return health_pb2.HealthCheckResponse.ServingStatus.Name(status)
