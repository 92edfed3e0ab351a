"""Request migration inside a scheduler: the requests of a worker that is lost (killed, its
connection reset, or silent past the gRPC keepalive timeout: grpc_util.KEEPALIVE_TIMEOUT_S)
continue on another ready replica of the same model, as a preempted request continues on its
own: recomputed from its first token, its output so far kept. The worker's sampler counts
positions from that output (seeded sampling resumes at (seed, position)), so greedy and seeded
requests end with exactly the tokens of a run without the failure, and the client sees neither
an error nor a repeated or missing token.

With no other replica ready, a request waits up to `wait_s` for one (the lost worker itself
may come back: its engine reconnects); then, or once it has moved `max_migrations` times, it
ends with UNAVAILABLE naming why. Each move is logged, counted
(layerserve:request_migrations_total{model, reason="worker_lost"}) and marked on the
`scheduler request` span (event `migrated`, as the tokenizer's on its own span).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from services.common.errors import LayerserveError, Unavailable
from services.scheduler.config import DEFAULT_MAX_MIGRATIONS, DEFAULT_MIGRATION_WAIT_S
from services.scheduler.engine import Emit, Engine
from services.scheduler.output import Output
from services.scheduler.request import FinishReason, Request, Status
from services.scheduler.request_trace import RequestTraces
from services.scheduler.router import Router
from services.scheduler.scheduler_metrics import REQUEST_MIGRATIONS, WORKER_LOST

log = logging.getLogger(__name__)

RETRY_S = 0.25
REASON = WORKER_LOST


@dataclass(slots=True)
class _Lost:
    """A request whose worker was lost, waiting for a replica to move to."""

    request: Request
    model: str
    engine: Engine  # the lost one: the router names it the owner until the request moves
    cause: str
    deadline: float


class Migrator:
    def __init__(
        self,
        router: Router,
        emit: Emit,
        traces: RequestTraces | None = None,
        max_migrations: int = DEFAULT_MAX_MIGRATIONS,
        wait_s: float = DEFAULT_MIGRATION_WAIT_S,
    ) -> None:
        self._router = router
        self._emit = emit  # where a request that cannot move gets its error
        self._traces = traces
        self.max_migrations = max_migrations
        self.wait_s = wait_s
        self._waiting: list[_Lost] = []
        self._task: asyncio.Task[None] | None = None

    def lost(self, engine: Engine, requests: list[Request], cause: str) -> None:
        """The engine's worker failed (`cause`); `requests` were released by its Scheduler
        (Request.moved). Each moves now, or waits for a replica."""
        model = engine.info.model if engine.info is not None else ""
        deadline = time.monotonic() + self.wait_s
        for request in requests:
            lost = _Lost(request, model, engine, cause, deadline)
            trace = self._traces.get(request.request_id) if self._traces is not None else None
            if trace is not None:
                trace.migrating(REASON, engine.address, len(request.output_token_ids))
            if not self._try_move(lost):
                self._waiting.append(lost)
        if self._waiting and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._retry())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _retry(self) -> None:
        try:
            while self._waiting:
                await asyncio.sleep(RETRY_S)
                self._waiting = [lost for lost in self._waiting if not self._try_move(lost)]
        finally:
            self._task = None

    def _try_move(self, lost: _Lost) -> bool:
        """Moves the request, or ends it; False when it should wait for a replica."""
        request = lost.request
        if self._router.owner(request.request_id) is not lost.engine:
            request.status, request.finish_reason = Status.FINISHED, FinishReason.ABORT
            self._end_trace(request, None)  # aborted while it waited
            return True
        what = f"its worker {lost.engine.address} was lost ({lost.cause})"
        if request.num_migrations > self.max_migrations:
            moves = request.num_migrations - 1
            self._fail(
                lost,
                f"{what}, and it was moved {moves} times already (the limit, --max-migrations)",
            )
            return True
        try:
            engine = self._router.place(request, lost.model)
        except LayerserveError as err:
            if time.monotonic() < lost.deadline:
                return False
            self._fail(
                lost,
                f"{what}, and no other worker of model `{lost.model}` could take "
                f"it within {self.wait_s:g}s ({err.message})",
            )
            return True
        REQUEST_MIGRATIONS.labels(lost.model, REASON).inc()
        log.warning(
            "request %s: %s; moved to worker %s after %d tokens (move %d)",
            request.request_id,
            what,
            engine.address,
            len(request.output_token_ids),
            request.num_migrations,
        )
        return True

    def _fail(self, lost: _Lost, message: str) -> None:
        request = lost.request
        log.warning("request %s: %s", request.request_id, message)
        error = Unavailable(message)
        request.status, request.finish_reason, request.error = (
            Status.FINISHED,
            FinishReason.ERROR,
            error,
        )
        self._end_trace(request, error.rpc_code)
        self._router.forget(request.request_id)
        output = Output.failed(request.request_id, error)
        output.migrations = request.num_migrations  # the tokenizer moves it no further
        self._emit([output])

    def _end_trace(self, request: Request, error: str | None) -> None:
        trace = self._traces.pop(request.request_id) if self._traces is not None else None
        if trace is not None:
            trace.finish(request, error)
