"""Workers added, drained and removed while the scheduler runs (the Admin API's domain side)."""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from services.common.errors import DeadlineExceeded, InvalidArgument, Unavailable
from services.scheduler.engine import Emit, Engine
from services.scheduler.output import Output
from services.scheduler.router import Router

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
    def __init__(self, router: Router, make_engine: Callable[[str], Engine], emit: Emit) -> None:
        self._router = router
        self._make_engine = make_engine
        self._emit = emit  # where a forced removal reports the requests it ends
        self._adding: set[str] = set()  # addresses being connected to

    def list(self) -> list[WorkerView]:
        return [self.view(engine) for engine in self._router.all_engines]

    def view(self, engine: Engine) -> WorkerView:
        info, load = engine.info, engine.load()
        if self._router.is_draining(engine.address):
            state = WorkerState.DRAINING
        else:
            state = WorkerState.READY if engine.ready else WorkerState.CONNECTING
        return WorkerView(
            address=engine.address,
            model=info.model if info is not None else "",
            model_path=info.model_path if info is not None else "",
            state=state,
            in_flight=len(self._router.in_flight(engine)),
            num_blocks=load.num_blocks if load is not None else 0,
            free_blocks=load.free_blocks if load is not None else 0,
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
        if self._router.has_engine(address):
            # Self-registering workers call again on every heartbeat (registration.py).
            return self.view(self._router.engine(address))
        self._adding.add(address)
        engine = self._make_engine(address)
        engine.start()
        try:
            await self._wait_ready(engine, timeout)
            self._check_same_weights(engine)
        except BaseException:
            await engine.stop()
            raise
        finally:
            self._adding.discard(address)
        self._router.add_engine(engine)
        model = engine.info.model if engine.info else "?"
        log.info("added worker %s (model %s)", address, model)
        return self.view(engine)

    async def _wait_ready(self, engine: Engine, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not engine.ready:
            if time.monotonic() > deadline:
                raise Unavailable(
                    f"the worker at `{engine.address}` did not answer within {timeout:g}s; "
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

    def _check_same_weights(self, engine: Engine) -> None:
        """Replicas of one model name must be interchangeable: requests move freely between
        them, and prefix caching trusts their KV to match."""
        info = engine.info
        assert info is not None
        for other in self._router.all_engines:
            theirs = other.info
            if theirs is None or theirs.model != info.model:
                continue
            if theirs.model_fingerprint != info.model_fingerprint:
                raise InvalidArgument(
                    f"the worker at `{engine.address}` serves other weights than the workers of "
                    f"model `{info.model}`; serve it under its own name (an alias can split "
                    "traffic between the two)"
                )

    def drain(self, address: str) -> WorkerView:
        engine = self._router.drain(address)
        log.info("draining worker %s", address)
        return self.view(engine)

    async def remove(self, address: str, force: bool = False, timeout: float = 0.0) -> Removal:
        """Removes a worker: without `force`, once it has drained (waiting up to `timeout`
        seconds, 0 = DEFAULT_DRAIN_TIMEOUT, else DeadlineExceeded and the worker stays
        draining); with `force` at once, ending its requests with UNAVAILABLE."""
        engine = self._router.engine(address)
        if not force:
            await self._wait_drained(engine, timeout or DEFAULT_DRAIN_TIMEOUT)
        before = self.view(engine)
        self._router.remove_engine(address)
        await engine.stop()  # closes the Execute stream: the worker drops what it held
        ended = self._router.in_flight(engine)
        if ended:
            error = Unavailable(
                f"the worker at {address} was removed by an operator; retry the request"
            )
            self._emit([Output.failed(request_id, error) for request_id in ended])
            for request_id in ended:
                self._router.forget(request_id)
        log.info("removed worker %s (%d requests ended)", address, len(ended))
        return Removal(before, len(ended))

    async def _wait_drained(self, engine: Engine, timeout: float) -> None:
        self._router.drain(engine.address)
        deadline = time.monotonic() + timeout
        while in_flight := len(self._router.in_flight(engine)):
            if time.monotonic() > deadline:
                raise DeadlineExceeded(
                    f"{in_flight} requests still run on `{engine.address}` after {timeout:g}s; "
                    "it stays drained: remove it later, or with force"
                )
            await asyncio.sleep(POLL_SECONDS)
