"""Workers added, drained and removed while the scheduler runs (the Admin API's domain side)."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from services.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from services.scheduler.router import Router
from services.scheduler.worker_link import Emit, WorkerLink, error_output

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
DEFAULT_ADD_TIMEOUT = 30.0
DEFAULT_DRAIN_TIMEOUT = 60.0


class WorkerState(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker as an operator sees it."""

    address: str
    model: str
    model_path: str
    state: WorkerState
    in_flight: int
    num_blocks: int
    free_blocks: int
    device: str


@dataclass(frozen=True, slots=True)
class Removal:
    worker: WorkerView
    requests_ended: int


class WorkerAdmin:
    def __init__(self, router: Router, make_link: Callable[[str], WorkerLink], emit: Emit) -> None:
        self._router = router
        self._make_link = make_link
        self._emit = emit  # where a forced removal reports the requests it ends
        self._adding: set[str] = set()  # addresses being connected to

    def list(self) -> list[WorkerView]:
        return [self.view(link) for link in self._router.all_links]

    def view(self, link: WorkerLink) -> WorkerView:
        info, scheduler = link.info, link.scheduler
        if self._router.is_draining(link.address):
            state = WorkerState.DRAINING
        else:
            state = WorkerState.READY if link.ready else WorkerState.CONNECTING
        return WorkerView(
            address=link.address,
            model=info.model if info is not None else "",
            model_path=info.model_path if info is not None else "",
            state=state,
            in_flight=len(self._router.in_flight(link)),
            num_blocks=scheduler.kv.pool.num_blocks if scheduler is not None else 0,
            free_blocks=scheduler.kv.pool.num_free if scheduler is not None else 0,
            device=info.device if info is not None else "",
        )

    async def add(self, address: str, timeout: float = 0.0) -> WorkerView:
        """Connects to the worker at `address` and routes to it once it is ready. Idempotent:
        a known address (even a draining one: an operator's drain stands) answers its current
        view, and one being added waits for that addition. Raises InvalidArgument (different
        weights under an existing model's name) or Unavailable (no answer within `timeout`
        seconds; 0 = DEFAULT_ADD_TIMEOUT)."""
        if ":" not in address:
            raise InvalidArgument(f"a worker address is HOST:PORT, got `{address}`")
        timeout = timeout or DEFAULT_ADD_TIMEOUT
        if address in self._adding:
            await self._wait_added(address, timeout)
        if self._router.has_link(address):
            # Self-registering workers call again on every heartbeat (registration.py).
            return self.view(self._router.link(address))
        self._adding.add(address)
        link = self._make_link(address)
        link.start()
        try:
            await self._wait_ready(link, timeout)
            self._check_same_weights(link)
        except BaseException:
            await link.stop()
            raise
        finally:
            self._adding.discard(address)
        self._router.add_link(link)
        log.info("added worker %s (model %s)", address, link.info.model if link.info else "?")
        return self.view(link)

    async def _wait_ready(self, link: WorkerLink, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not link.ready:
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"the worker at `{link.address}` did not answer within {timeout:g}s; "
                    "it was not added"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def _wait_added(self, address: str, timeout: float) -> None:
        """Waits for another call's addition of `address` to end, either way."""
        deadline = time.monotonic() + timeout
        while address in self._adding:
            if time.monotonic() > deadline:
                raise Unavailable(f"the worker at `{address}` is still being added; retry")
            await asyncio.sleep(POLL_SECONDS)

    def _check_same_weights(self, link: WorkerLink) -> None:
        """Replicas of one model name must be interchangeable: requests move freely between
        them, and prefix caching trusts their KV to match."""
        info = link.info
        assert info is not None
        for other in self._router.all_links:
            theirs = other.info
            if theirs is None or theirs.model != info.model:
                continue
            if theirs.model_fingerprint != info.model_fingerprint:
                raise InvalidArgument(
                    f"the worker at `{link.address}` serves other weights than the workers of "
                    f"model `{info.model}`; serve it under its own name (an alias can split "
                    "traffic between the two)"
                )

    def drain(self, address: str) -> WorkerView:
        link = self._router.drain(address)
        log.info("draining worker %s", address)
        return self.view(link)

    async def remove(self, address: str, force: bool = False, timeout: float = 0.0) -> Removal:
        """Removes a worker: without `force`, once it has drained (waiting up to `timeout`
        seconds, 0 = DEFAULT_DRAIN_TIMEOUT, else DeadlineExceeded and the worker stays
        draining); with `force` at once, ending its requests with UNAVAILABLE."""
        link = self._router.link(address)
        if not force:
            await self._wait_drained(link, timeout or DEFAULT_DRAIN_TIMEOUT)
        before = self.view(link)
        self._router.remove_link(address)
        await link.stop()  # closes the Execute stream: the worker drops what it held
        ended = self._router.in_flight(link)
        if ended:
            message = f"the worker at {address} was removed by an operator; retry the request"
            self._emit([error_output(rid, grpc.StatusCode.UNAVAILABLE, message) for rid in ended])
            for request_id in ended:
                self._router.forget(request_id)
        log.info("removed worker %s (%d requests ended)", address, len(ended))
        return Removal(before, len(ended))

    async def _wait_drained(self, link: WorkerLink, timeout: float) -> None:
        self._router.drain(link.address)
        deadline = time.monotonic() + timeout
        while in_flight := len(self._router.in_flight(link)):
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"{in_flight} requests still run on `{link.address}` after {timeout:g}s; "
                    "it stays drained: remove it later, or with force"
                )
            await asyncio.sleep(POLL_SECONDS)
