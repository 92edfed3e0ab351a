"""A worker that keeps itself known to a scheduler: `--register-with SCHEDULER --advertise ME`,
or `--register-with HOME,FALLBACK,...` with several scheduler replicas.

Where workers come and go (Kubernetes pods, autoscaling), nobody edits the scheduler's
--worker list: each worker calls the scheduler's Admin API (the key in LAYERSERVE_ADMIN_KEY).

- Once the worker is serving, AddWorker(advertise). While the scheduler cannot be reached
  (not started yet, restarting) it retries with a backoff.
- Every heartbeat it asks ListWorkers whether the scheduler still knows it, and adds itself
  again when not: a restarted scheduler starts with no memory of the workers it had.
- On SIGTERM, RemoveWorker before the worker's own drain: the scheduler stops routing to it,
  waits for the requests it runs there to finish (up to the drain timeout; then it removes it
  by force, ending the rest with UNAVAILABLE) and closes the stream. A scheduler that is gone
  by then has nothing to forget.

AddWorker is idempotent, so a heartbeat racing another one (or an operator) is harmless. A
worker the operator drained stays drained: the heartbeat sees it listed and leaves it alone.

With several schedulers the worker is registered with one at a time (a worker takes one
driving stream): its home, the first listed, while that answers. When the one it is with
stops answering (killed, its node gone), the next heartbeat registers it with the first other
that answers, so its model keeps its capacity within a heartbeat or two. While away it asks
its home at every heartbeat; once the home answers again (restarted), the worker drains
itself from the fallback (RemoveWorker: the requests running there finish first) and goes
home, so a restarted scheduler gets its workers back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from google.protobuf.message import Message

from layerserve.scheduler.v1 import admin_pb2, admin_pb2_grpc
from services.common.grpc_util import new_channel

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
FIRST_BACKOFF_S = 0.5
MAX_BACKOFF_S = 10.0
CALL_TIMEOUT_S = 10.0
# What AddWorker may wait for the scheduler to reach this (already serving) worker.
ADD_TIMEOUT_S = 30.0
# Tries of home (backing off from FIRST_BACKOFF_S: about 3.5 s) before a worker that never
# registered anywhere yet takes a fallback.
STARTUP_TRIES = 3
# What a home that answered gets to drain this worker from a fallback before it goes home.
MOVE_DRAIN_S = 60.0
# Statuses that retrying will not fix without an operator: said loudly, still retried.
_MISCONFIGURED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)
# Statuses of a scheduler that is gone (or unreachable): time to try another.
_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class Registration:
    """Keeps `address` (this worker, as the scheduler should dial it) registered with one of
    the schedulers in `schedulers` (HOST:PORT, comma-separated; the first is its home) until
    deregister()."""

    def __init__(
        self,
        schedulers: str,
        address: str,
        admin_key: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        move_drain_s: float = MOVE_DRAIN_S,
    ) -> None:
        self.schedulers = [s.strip() for s in schedulers.split(",") if s.strip()]
        if not self.schedulers:
            raise ValueError(f"--register-with names no scheduler: {schedulers!r}")
        self.scheduler = self.schedulers[0]  # the one it is registered with (or tries)
        self.address = address
        self._metadata = (("authorization", f"Bearer {admin_key}"),)
        self._heartbeat_s = heartbeat_s
        self._move_drain_s = move_drain_s
        self._channels = {s: new_channel(s) for s in self.schedulers}
        self._admins = {s: admin_pb2_grpc.AdminStub(c) for s, c in self._channels.items()}
        self._task: asyncio.Task[None] | None = None

    @property
    def _admin(self) -> admin_pb2_grpc.AdminStub:
        return self._admins[self.scheduler]

    def start(self) -> None:
        """Registers in the background and keeps registered; call once the worker serves."""
        self._task = asyncio.get_running_loop().create_task(self._keep_registered())

    async def deregister(self, drain_timeout: float) -> None:
        """Stops the heartbeat and has the scheduler drain and forget this worker, waiting up
        to `drain_timeout` seconds for the requests it runs here. Never raises."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            await self._remove(drain_timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND:
                log.info("the scheduler at %s no longer knew this worker", self.scheduler)
            else:
                log.warning(
                    "could not deregister from the scheduler at %s (%s: %s)",
                    self.scheduler,
                    err.code().name,
                    err.details(),
                )
        finally:
            await asyncio.gather(*(channel.close() for channel in self._channels.values()))

    async def _remove(self, drain_timeout: float) -> None:
        log.info("deregistering %s from the scheduler at %s", self.address, self.scheduler)
        request = admin_pb2.RemoveWorkerRequest(
            address=self.address, drain_timeout_seconds=max(drain_timeout, 0.001)
        )
        try:
            response = await self._call(self._admin.RemoveWorker, request, drain_timeout)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
            # Still running requests after the drain timeout: the worker is going anyway.
            forced = admin_pb2.RemoveWorkerRequest(address=self.address, force=True)
            response = await self._call(self._admin.RemoveWorker, forced)
        log.info(
            "deregistered from the scheduler at %s (%d requests ended)",
            self.scheduler,
            response.requests_ended,
        )

    async def _keep_registered(self) -> None:
        backoff = FIRST_BACKOFF_S  # the wait before the next try while failing
        registered = False  # once, ever: a later AddWorker means the scheduler forgot it
        failing = False
        misses = 0  # failed tries in a row while never registered
        while True:
            try:
                moved = await self._go_home_if_back()
                try:
                    if not await self._is_listed():
                        await self._add(again=registered and not moved)
                except grpc.aio.AioRpcError as err:
                    # At start-up home may just be slower to come up than this worker: it gets
                    # a few tries (seconds) before another scheduler takes the worker.
                    patient = not registered and misses < STARTUP_TRIES
                    if len(self.schedulers) == 1 or err.code() not in _GONE or patient:
                        misses += 1
                        raise
                    await self._fail_over(err)
                registered, failing, backoff, misses = True, False, FIRST_BACKOFF_S, 0
                delay = self._heartbeat_s
            except grpc.aio.AioRpcError as err:
                self._log_failure(err, first=not failing, backoff=backoff)
                failing = True
                delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_S)
            except Exception:  # a bug must not end registration for the worker's lifetime
                log.exception("registration check failed; retrying in %.1fs", backoff)
                delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_S)
            await asyncio.sleep(delay)

    async def _fail_over(self, err: grpc.aio.AioRpcError) -> None:
        """Registers with the first other scheduler that answers (home first); raises `err`
        when none does."""
        lost = self.scheduler
        for candidate in [s for s in self.schedulers if s != lost]:
            self.scheduler = candidate
            try:
                if not await self._is_listed():
                    await self._add(again=False)
            except grpc.aio.AioRpcError:
                continue
            log.warning(
                "the scheduler at %s does not answer (%s); registered with the one at %s",
                lost,
                err.code().name,
                candidate,
            )
            return
        self.scheduler = lost
        raise err

    async def _go_home_if_back(self) -> bool:
        """Away from home while the home answers again: drain from here, then go home.
        Returns whether it did."""
        home = self.schedulers[0]
        if self.scheduler == home:
            return False
        try:
            await self._admins[home].ListWorkers(
                admin_pb2.ListWorkersRequest(), metadata=self._metadata, timeout=CALL_TIMEOUT_S
            )
        except grpc.aio.AioRpcError:
            return False  # still away
        log.info("the home scheduler at %s answers again: moving back to it", home)
        try:
            await self._remove(self._move_drain_s)
        except grpc.aio.AioRpcError as err:
            if err.code() not in (*_GONE, grpc.StatusCode.NOT_FOUND):
                raise
        self.scheduler = home
        return True

    async def _is_listed(self) -> bool:
        listed = await self._call(self._admin.ListWorkers, admin_pb2.ListWorkersRequest())
        return any(worker.address == self.address for worker in listed.workers)

    async def _add(self, again: bool) -> None:
        request = admin_pb2.AddWorkerRequest(address=self.address, timeout_seconds=ADD_TIMEOUT_S)
        status = await self._call(self._admin.AddWorker, request, ADD_TIMEOUT_S)
        log.info(
            "registered %s (model %s) with the scheduler at %s%s",
            self.address,
            status.model,
            self.scheduler,
            " again: it had forgotten this worker (restarted?)" if again else "",
        )

    async def _call(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable,
        request: Message,
        extra_timeout: float = 0.0,
    ) -> Any:
        return await method(
            request, metadata=self._metadata, timeout=CALL_TIMEOUT_S + extra_timeout
        )

    def _log_failure(self, err: grpc.aio.AioRpcError, *, first: bool, backoff: float) -> None:
        """Loud once per outage (and always when retrying cannot help), quiet while it lasts."""
        level = logging.WARNING if first else logging.DEBUG
        if err.code() in _MISCONFIGURED:
            level = logging.ERROR
        log.log(
            level,
            "cannot register with the scheduler at %s (%s: %s); retrying in %.1fs",
            self.scheduler,
            err.code().name,
            err.details(),
            backoff,
        )
