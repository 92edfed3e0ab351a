"""A worker that keeps itself known to a scheduler: `--register-with SCHEDULER --advertise ME`.

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
# Statuses that retrying will not fix without an operator: said loudly, still retried.
_MISCONFIGURED = (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)


class Registration:
    """Keeps `address` (this worker, as the scheduler should dial it) registered with the
    scheduler at `scheduler` until deregister()."""

    def __init__(
        self,
        scheduler: str,
        address: str,
        admin_key: str,
        *,
        heartbeat_s: float = HEARTBEAT_S,
    ) -> None:
        self.scheduler = scheduler
        self.address = address
        self._metadata = (("authorization", f"Bearer {admin_key}"),)
        self._heartbeat_s = heartbeat_s
        self._channel = new_channel(scheduler)
        self._admin = admin_pb2_grpc.AdminStub(self._channel)
        self._task: asyncio.Task[None] | None = None

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
            await self._channel.close()

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
        while True:
            try:
                if not await self._is_listed():
                    await self._add(again=registered)
                registered, failing, backoff = True, False, FIRST_BACKOFF_S
                delay = self._heartbeat_s
            except grpc.aio.AioRpcError as err:
                self._log_failure(err, first=not failing, backoff=backoff)
                failing = True
                delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_S)
            except Exception:  # a bug must not end registration for the worker's lifetime
                log.exception("registration check failed; retrying in %.1fs", backoff)
                delay, backoff = backoff, min(backoff * 2, MAX_BACKOFF_S)
            await asyncio.sleep(delay)

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
