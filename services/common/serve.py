"""Running a service process: serve until SIGINT/SIGTERM, then drain and exit 0.

A drain (`drain_server`): health turns NOT_SERVING (load balancers stop sending), new RPCs are
refused with UNAVAILABLE, the service stops taking new requests on its open streams, and what
is in flight gets up to the drain timeout to finish; then the server stops, cutting only what
is left at the deadline.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Iterable

import grpc

from services.common.drain_gate import DrainGate
from services.common.health import Health
from services.common.internal_auth import InternalAuthError
from services.common.settings import SettingError, exit_for_setting

log = logging.getLogger(__name__)

DEFAULT_DRAIN_TIMEOUT_S = 30.0
_POLL_SECONDS = 0.05
# RPCs still open once the work is done (a scheduler's idle step stream, a finished stream's
# status on its way out) get this long before the server cuts them.
_STOP_GRACE_SECONDS = 1.0


def check_drain_timeout(seconds: float) -> None:
    if not seconds >= 0:
        raise ValueError(f"--drain-timeout-s must be >= 0, got {seconds}")


async def wait_for_shutdown() -> None:
    """Returns on the first SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def wait_idle(busy: Callable[[], int], timeout: float) -> bool:
    """Waits until busy() is 0; False if it still was not after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while busy() > 0:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(_POLL_SECONDS)
    return True


async def drain_server(
    server: grpc.aio.Server,
    health: Health,
    gate: DrainGate,
    *,
    timeout: float,
    name: str,
    stop_taking: Iterable[Callable[[], None]] = (),
    busy: Callable[[], int] | None = None,
) -> None:
    """The drain described above. `stop_taking`: what makes the service refuse new requests
    on streams already open; `busy`: what is in flight (default: the RPCs in progress)."""
    in_flight = busy or (lambda: gate.in_flight)
    log.info("%s draining: %d in flight, up to %gs to finish", name, in_flight(), timeout)
    health.drain()
    gate.close()
    for stop in stop_taking:
        stop()
    if await wait_idle(in_flight, timeout):
        log.info("%s drained", name)
    else:
        log.warning(
            "%s drain timed out after %gs: cutting %d in flight", name, timeout, in_flight()
        )
    await server.stop(grace=_STOP_GRACE_SECONDS)


def run_service(main: Callable[[], Awaitable[None]]) -> None:
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
    except InternalAuthError as err:  # e.g. an internal port beyond loopback, unauthenticated
        raise SystemExit(f"cannot start: {err}") from None
    except SettingError as err:  # one read after start-up began (e.g. the grammar settings)
        exit_for_setting("layerserve", err)
