"""What `make run` does once the stack is up: a process it started (a service, or the
redis-server) that exits without being asked is started again, on the same port and with the
same arguments, after a backoff that doubles while it keeps crashing; each exit and restart is
logged. The stack stops only on Ctrl-C or SIGTERM (services/launcher.py).

While one process is away the others keep serving what they can: a worker's replicas take its
requests, the gateway answers 503 while the tokenizer or scheduler is away, and with Redis
away rate limits follow LAYERSERVE_RATE_LIMIT_ON_REDIS_FAILURE and routing falls back to the
scheduler's own view (README "Keys, rate limits and usage").
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.stack import Stack

log = logging.getLogger("layerserve")


@dataclass(frozen=True)
class Backoff:
    first_s: float = 1.0  # the wait before the first restart
    max_s: float = 30.0  # doubling stops here
    # A process that ran this long before exiting starts again from first_s: a crash now and
    # then is not a crash loop.
    reset_after_s: float = 60.0


@dataclass
class _Watch:
    started_at: float
    delay_s: float = 0.0  # the last backoff used; 0: none yet
    restart_at: float | None = None  # set while it waits to be started again
    restarts: int = 0


@dataclass
class Supervisor:
    stack: Stack
    backoff: Backoff = field(default_factory=Backoff)
    clock: Callable[[], float] = time.monotonic
    _watches: dict[str, _Watch] = field(default_factory=dict)

    def __post_init__(self) -> None:
        now = self.clock()
        self._watches = {name: _Watch(started_at=now) for name in self.stack.procs}

    def restarts(self, name: str) -> int:
        return self._watches[name].restarts

    def poll(self) -> None:
        """Notices exits and starts what is due; never blocks. Call it every half second."""
        now = self.clock()
        for name, watch in self._watches.items():
            if watch.restart_at is not None:
                if now >= watch.restart_at:
                    self._restart(name, watch, now)
                continue
            code = self.stack.procs[name].poll()
            if code is not None:
                self._schedule(name, watch, code, now)

    def _schedule(self, name: str, watch: _Watch, code: int, now: float) -> None:
        ran_s = now - watch.started_at
        if watch.delay_s == 0 or ran_s >= self.backoff.reset_after_s:
            watch.delay_s = self.backoff.first_s
        else:
            watch.delay_s = min(2 * watch.delay_s, self.backoff.max_s)
        watch.restart_at = now + watch.delay_s
        log.warning(
            "%s %s after %.1fs; starting it again in %gs",
            name,
            describe_exit(code),
            ran_s,
            watch.delay_s,
        )

    def _restart(self, name: str, watch: _Watch, now: float) -> None:
        try:
            self.stack.restart(name)
        except OSError as err:  # e.g. its executable is gone; try again later
            log.error("could not start %s again: %s", name, err)
            watch.started_at = now
            self._schedule(name, watch, -1, now)
            return
        watch.started_at, watch.restart_at = now, None
        watch.restarts += 1
        log.info(
            "started %s again (pid %d, restart %d)",
            name,
            self.stack.procs[name].pid,
            watch.restarts,
        )


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"
