"""The gRPC Health Checking Protocol (grpc.health.v1) on a service's server: honest readiness.

Each server reports its own services by full name (e.g. "layerserve.worker.v1.Worker") and ""
for the whole server. A readiness check (the service's own: model warmed up, a live worker, a
serving scheduler) is re-evaluated every `interval` seconds and its answer published; services
that need no dependency (the scheduler's Admin) are SERVING while the process is. On drain
every service turns NOT_SERVING for good and open Watch streams end, so that a watcher never
holds a draining server open.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
HEALTH_METHOD_PREFIX = "/grpc.health.v1.Health/"

# The reason the service is not ready, or None when it is. May be a coroutine function.
ReadinessCheck = Callable[[], Awaitable[str | None] | str | None]


def service_name(module, service: str) -> str:
    """The full name of `service` in a generated *_pb2 module, e.g. worker_pb2, "Worker"."""
    return module.DESCRIPTOR.services_by_name[service].full_name


class _HealthServicer(health_pb2_grpc.HealthServicer):
    """Check and Watch over a status table. Not the package's reference servicer: its Watch
    never returns, so every watcher would hold a draining server open until the deadline.
    Here a Watch ends once the server drains, after telling the watcher NOT_SERVING."""

    def __init__(self) -> None:
        self.status: dict[str, int] = {}
        self.drained = False
        self._changed = asyncio.Event()  # replaced by a fresh one at every change

    def set(self, service: str, status: int) -> None:
        if self.status.get(service) == status:
            return
        self.status[service] = status
        self._notify()

    def drain(self) -> None:
        self.status = dict.fromkeys(self.status, NOT_SERVING)
        self.drained = True
        self._notify()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def Check(self, request, context) -> health_pb2.HealthCheckResponse:
        status = self.status.get(request.service)
        if status is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(self, request, context) -> None:
        last = None
        while True:
            changed = self._changed  # taken first: a change while writing is not missed
            status = self.status.get(request.service, SERVICE_UNKNOWN)
            if status != last:
                await context.write(health_pb2.HealthCheckResponse(status=status))
                last = status
                continue  # the status may have moved on while writing (to a drain's, too)
            if self.drained:
                return
            await changed.wait()


class Health:
    """One server's health: `services` follow `check`, `always` are SERVING until drain."""

    def __init__(
        self,
        services: Iterable[str],
        check: ReadinessCheck,
        *,
        always: Iterable[str] = (),
        interval: float = 0.25,
        name: str = "service",
    ) -> None:
        self.servicer = _HealthServicer()
        self._services = ["", *services]
        self._always = list(always)
        self._check = check
        self._interval = interval
        self._name = name
        self._ready: bool | None = None
        self._task: asyncio.Task[None] | None = None

    def add_to(self, server: grpc.aio.Server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def start(self) -> None:
        """NOT_SERVING until the first check says otherwise; then follows the check."""
        for service in self._services:
            self.servicer.set(service, NOT_SERVING)
        for service in self._always:
            self.servicer.set(service, SERVING)
        self._task = asyncio.get_running_loop().create_task(self._follow())

    def drain(self) -> None:
        """NOT_SERVING for every service, for good; open Watch streams end. Synchronous, so
        that nothing is served between this and the rest of the drain's first steps."""
        if self._task is not None:
            self._task.cancel()
        self.servicer.drain()

    async def _follow(self) -> None:
        while True:
            try:
                reason = self._check()
                if inspect.isawaitable(reason):
                    reason = await reason
            except Exception as err:  # a broken check must not leave a stale SERVING behind
                log.exception("%s readiness check failed", self._name)
                reason = f"the readiness check failed: {err}"
            self._publish(reason)
            await asyncio.sleep(self._interval)

    def _publish(self, reason: str | None) -> None:
        ready = reason is None
        if ready == self._ready:
            return
        if ready:
            log.info("%s is SERVING", self._name)
        elif self._ready is None:
            log.info("%s is NOT_SERVING yet: %s", self._name, reason)
        else:
            log.warning("%s is NOT_SERVING: %s", self._name, reason)
        self._ready = ready
        for service in self._services:
            self.servicer.set(service, SERVING if ready else NOT_SERVING)
