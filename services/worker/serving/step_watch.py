"""Liveness of the engine: when the step running now started, and whether it has overrun.

A step that has not returned within its bound counts as hung: the worker then reports
NOT_SERVING (the scheduler stops routing to it) until a step returns. Steps run one at a time
on the model thread through run(); problem() is asked from the event loop."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class StepWatch:
    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        # When the running step started; None between steps. Written by the model thread only
        # (one float: no lock needed to read it).
        self._started: float | None = None

    def run(self, fn: Callable[..., T], *args) -> T:
        """Calls fn(*args) as the running step (on the model thread)."""
        self._started = started = self._clock()
        try:
            return fn(*args)
        finally:
            self._started = None
            took = self._clock() - started
            if took > self.timeout_s:
                log.warning(
                    "an engine step returned after %.2fs, over the %gs bound", took, self.timeout_s
                )

    def problem(self) -> str | None:
        """Why the engine counts as hung now, or None."""
        started = self._started
        if started is None:
            return None
        running = self._clock() - started
        if running <= self.timeout_s:
            return None
        return (
            f"the engine step has not returned after {running:.1f}s "
            f"(bound {self.timeout_s:g}s, --step-timeout-s)"
        )
