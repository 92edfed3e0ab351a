"""scheduler.v1.Admin over gRPC: the operator API, guarded by its own key."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from layerserve.scheduler.v1 import admin_pb2, admin_pb2_grpc
from services.common.grpc_util import call_domain
from services.scheduler.alias_proto import alias_from_proto
from services.scheduler.aliases import AliasTable
from services.scheduler.router import Router
from services.scheduler.worker_admin import WorkerAdmin, WorkerState, WorkerView

T = TypeVar("T")

_STATE = {
    WorkerState.CONNECTING: admin_pb2.WORKER_STATE_CONNECTING,
    WorkerState.READY: admin_pb2.WORKER_STATE_READY,
    WorkerState.DRAINING: admin_pb2.WORKER_STATE_DRAINING,
}
DISABLED = (
    "the admin API is disabled: start the scheduler with LAYERSERVE_ADMIN_KEY=<key> set, then "
    "call it with the metadata `authorization: Bearer <key>`"
)


def worker_to_proto(view: WorkerView) -> admin_pb2.WorkerStatus:
    return admin_pb2.WorkerStatus(
        address=view.address,
        model=view.model,
        model_path=view.model_path,
        state=_STATE[view.state],
        in_flight=view.in_flight,
        num_blocks=view.num_blocks,
        free_blocks=view.free_blocks,
        device=view.device,
    )


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(
        self, workers: WorkerAdmin, router: Router, aliases: AliasTable, admin_key: str
    ) -> None:
        self._workers = workers
        self._router = router
        self._aliases = aliases
        self._key = admin_key

    async def _call(self, context, fn: Callable[[], Awaitable[T]]) -> T:
        """Checks the admin key, then runs the domain call (its errors become statuses)."""
        if not self._key:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, DISABLED)
        given = dict(context.invocation_metadata() or ()).get("authorization", "")
        expected = f"Bearer {self._key}"
        if not hmac.compare_digest(given.encode(), expected.encode()):
            await context.abort(
                grpc.StatusCode.PERMISSION_DENIED,
                "missing or wrong admin key (metadata `authorization: Bearer <admin key>`)",
            )
        return await call_domain(context, fn)

    async def AddWorker(self, request, context) -> admin_pb2.WorkerStatus:
        async def run() -> admin_pb2.WorkerStatus:
            view = await self._workers.add(request.address, request.timeout_seconds)
            return worker_to_proto(view)

        return await self._call(context, run)

    async def DrainWorker(self, request, context) -> admin_pb2.WorkerStatus:
        async def run() -> admin_pb2.WorkerStatus:
            return worker_to_proto(self._workers.drain(request.address))

        return await self._call(context, run)

    async def RemoveWorker(self, request, context) -> admin_pb2.RemoveWorkerResponse:
        async def run() -> admin_pb2.RemoveWorkerResponse:
            removal = await self._workers.remove(
                request.address, request.force, request.drain_timeout_seconds
            )
            return admin_pb2.RemoveWorkerResponse(
                worker=worker_to_proto(removal.worker), requests_ended=removal.requests_ended
            )

        return await self._call(context, run)

    async def ListWorkers(self, request, context) -> admin_pb2.ListWorkersResponse:
        async def run() -> admin_pb2.ListWorkersResponse:
            views = self._workers.list()
            return admin_pb2.ListWorkersResponse(workers=[worker_to_proto(v) for v in views])

        return await self._call(context, run)

    async def SetAlias(self, request, context) -> admin_pb2.SetAliasResponse:
        async def run() -> admin_pb2.SetAliasResponse:
            alias = alias_from_proto(request.alias)
            self._aliases.check(alias, self._router.model_names())
            return admin_pb2.SetAliasResponse(replaced=self._aliases.set(alias))

        return await self._call(context, run)

    async def DeleteAlias(self, request, context) -> admin_pb2.DeleteAliasResponse:
        async def run() -> admin_pb2.DeleteAliasResponse:
            self._aliases.delete(request.name)
            return admin_pb2.DeleteAliasResponse()

        return await self._call(context, run)
