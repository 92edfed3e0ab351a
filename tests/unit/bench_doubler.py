"""A stand-in baseline for tests/unit/test_bench_baseline_process.py, in a module of its own
that imports nothing heavy: the child process imports it by name to build it."""

from __future__ import annotations

import os
import signal


class Doubler:
    """Answers, or dies the way a native crash does."""

    def __init__(self, base: int) -> None:
        self.base = base

    def generate(self, count: int) -> list[int]:
        return [2 * self.base] * count

    def crash(self) -> None:
        os.kill(os.getpid(), signal.SIGSEGV)
