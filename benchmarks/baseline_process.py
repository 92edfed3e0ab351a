"""A baseline in a child process of its own, so that its crash is its own: llama.cpp built for
the wrong CPU dies with SIGSEGV inside llama_decode (rc 139, no Python traceback), and in the
bench's own process it would take every other row with it. The parent reports the crash in the
baseline's row and the run goes on.

The child (`python -m benchmarks.baseline_process`) builds its object once from a factory and
then runs calls on it; both ends exchange pickled messages over its stdin and stdout (the
child points its fd 1 at stderr first, so a library's prints cannot corrupt them). Each call
is timed in the child, around the call alone."""

from __future__ import annotations

import os
import pickle
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
_HEADER = struct.Struct("!Q")  # each message: its length, then the pickle
STDERR_TAIL = 2000  # characters of a crashed child's stderr kept for the note


class BaselineCrashed(RuntimeError):
    """The child died (a signal or an exit) or raised; str() says how, for the row's note."""


class BaselineProcess:
    """factory(*args) built in a child process; call(fn, *args) runs fn(obj, *args) there and
    returns (fn's result, seconds the call took). factory and fn must be importable by name
    (module-level functions or classes, methods of them)."""

    def __init__(self, factory: Callable, *args: Any) -> None:
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.baseline_process"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
        )  # fmt: skip
        self.crash: str | None = None  # why the child is gone (or its factory failed)
        try:
            self._request((factory, args))
        except BaselineCrashed as err:
            self.crash = str(err)

    def call(self, fn: Callable, *args: Any) -> tuple[Any, float]:
        """Raises BaselineCrashed when the child dies or the call raised there."""
        return self._request((fn, args))

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()

    def _request(self, message: tuple) -> tuple[Any, float]:
        if self.crash is not None:
            raise BaselineCrashed(self.crash)
        try:
            _send(self._proc.stdin, message)
            ok, value, seconds = _receive(self._proc.stdout)
        except (EOFError, BrokenPipeError):
            self.crash = self._death()
            raise BaselineCrashed(self.crash) from None
        if not ok:
            raise BaselineCrashed(f"raised in its process: {value}")
        return value, seconds

    def _death(self) -> str:
        rc = self._proc.wait()
        self._stderr.seek(0)
        tail = self._stderr.read().decode(errors="replace")[-STDERR_TAIL:].strip()
        return f"crashed: {exit_status(rc)}" + (f"; stderr ends: {tail}" if tail else "")


def exit_status(returncode: int) -> str:
    """A child's end as a shell shows it: a signal's name and rc 128 + its number."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return f"killed by {name} (rc {128 - returncode})"
    return f"exited with rc {returncode}"


def _send(stream: IO[bytes], message: object) -> None:
    data = pickle.dumps(message)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> Any:
    header = stream.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError
    size = _HEADER.unpack(header)[0]
    data = stream.read(size)
    if len(data) < size:
        raise EOFError
    return pickle.loads(data)


def _serve() -> None:
    """The child: build the object from the first message, then answer calls until stdin
    closes. An exception is answered, not fatal: the parent decides."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # stray prints (C libraries included) go to stderr, not into the replies
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    obj = None
    while True:
        try:
            fn, args = _receive(requests)
        except EOFError:
            return
        started = time.perf_counter()
        try:
            value = fn(*args) if obj is None else fn(obj, *args)
            reply = (True, None if obj is None else value, time.perf_counter() - started)
            obj = value if obj is None else obj
        except Exception as err:  # the traceback to stderr, the one line to the parent
            traceback.print_exc()
            reply = (False, f"{type(err).__name__}: {err}", 0.0)
        _send(replies, reply)


if __name__ == "__main__":
    _serve()
