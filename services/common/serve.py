"""Running a service process: serve until SIGINT/SIGTERM, then stop gracefully."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def wait_for_shutdown() -> None:
    """Returns on the first SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def run_service(main: Callable[[], Awaitable[None]]) -> None:
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
