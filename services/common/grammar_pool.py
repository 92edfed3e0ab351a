"""Grammar checks in child processes (grammar_child.py), so that a client's grammar can neither
take a service down nor stall it: the limits (grammar_limits.py) and llguidance's compile run
there, one grammar per process at a time, under a time budget. A process that dies (the engine
crashed) or runs past the budget is killed and replaced, and only the request that sent that
grammar fails, with InvalidArgument naming its field. The event loop only awaits.

Every service that compiles grammars checks through one pool: the gateway (without a
vocabulary), the tokenizer (with the target model's) and the worker (before its own compile,
which must happen in its process: the matcher masks its rows).

    pool = grammar_pool()                      # the process's pool; reads its settings
    await pool.check_async(structured, "response_format", vocabulary)
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import queue
import subprocess
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from services.common.errors import Internal, InvalidArgument
from services.common.grammar_limits import GrammarSettings
from services.common.sampling import StructuredOutput
from services.common.settings import PREFIX

log = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parents[2]  # the repository: the child runs from it
# Starting a process (its imports) and building a vocabulary (~1 s for 49k tokens) are not
# the grammar's time.
VOCABULARY_TIMEOUT_S = 120.0
VERDICTS_KEPT = 512


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """A model's vocabulary, sent to each grammar process once (key: unique per process)."""

    key: int
    tokenizer_json: Callable[[], str]  # a tokenizers.Tokenizer's JSON (Tokenizer.to_str())
    eos_token_ids: Sequence[int]
    vocab_size: int | None


class _Child:
    """One grammar process and its two pipes."""

    def __init__(self) -> None:
        to_child, self._requests = _pipe()
        self._replies, from_child = _pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.common.grammar_child", str(to_child.fileno()),
             str(from_child.fileno())],
            cwd=_ROOT, pass_fds=(to_child.fileno(), from_child.fileno()), stdin=subprocess.DEVNULL,
        )  # fmt: skip
        to_child.close()
        from_child.close()
        self.vocabularies: set[int] = set()
        if not self._replies.poll(VOCABULARY_TIMEOUT_S):  # its imports (EOF: it failed)
            self.kill()
            raise Internal("the grammar process did not start")
        try:
            self._replies.recv()
        except (EOFError, OSError):
            self.kill()
            raise Internal("the grammar process did not start") from None

    def ask(self, message: tuple, timeout_s: float) -> tuple[str, str] | None:
        """The reply; None when the process died or ran past timeout_s (it is then killed)."""
        try:
            self._requests.send(message)
            if self._replies.poll(timeout_s):
                return self._replies.recv()
        except (EOFError, OSError):
            pass
        self.kill()
        return None

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._requests.close()
        self._replies.close()


def _pipe() -> tuple[Connection, Connection]:
    """(read end, write end), not inherited by other children."""
    read, write = os.pipe()
    return Connection(read, writable=False), Connection(write, readable=False)


class GrammarPool:
    """settings.processes grammar processes, started on first use and replaced when one dies."""

    def __init__(self, settings: GrammarSettings) -> None:
        self.settings = settings
        self._idle: queue.LifoQueue[_Child | None] = queue.LifoQueue()
        for _ in range(settings.processes):
            self._idle.put(None)  # a place for a process not started yet
        self._threads = ThreadPoolExecutor(settings.processes, thread_name_prefix="grammar")
        self._verdicts: OrderedDict[tuple, str] = OrderedDict()  # "" = fine, else the error
        self._lock = threading.Lock()
        self.restarts = 0  # processes that died or were killed (for tests and logs)

    async def check_async(
        self, structured: StructuredOutput, param: str, vocabulary: Vocabulary | None = None
    ) -> None:
        """check(), awaited off the event loop."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._threads, self.check, structured, param, vocabulary)

    def check(
        self, structured: StructuredOutput, param: str, vocabulary: Vocabulary | None = None
    ) -> None:
        """Raises InvalidArgument naming `param` when the constraint is over a limit, does not
        compile (for `vocabulary`, or without one), crashes the engine or runs past the time
        budget. Blocks: call it from a thread (check_async does)."""
        key = (structured, param, vocabulary.key if vocabulary else None)
        with self._lock:
            verdict = self._verdicts.get(key)
        if verdict is None:
            verdict = self._verdict(structured, param, vocabulary)
            with self._lock:
                self._verdicts[key] = verdict
                while len(self._verdicts) > VERDICTS_KEPT:
                    self._verdicts.popitem(last=False)
        if verdict:
            raise InvalidArgument(verdict, param=param)

    def _verdict(
        self, structured: StructuredOutput, param: str, vocabulary: Vocabulary | None
    ) -> str:
        child = self._idle.get()
        try:
            child = child if child is not None and child.process.poll() is None else _Child()
            if vocabulary is not None and vocabulary.key not in child.vocabularies:
                child = self._teach(child, vocabulary)
            message = ("check", structured, param, self.settings, _key(vocabulary))
            reply = child.ask(message, self.settings.timeout_s)
            if reply is not None:
                return "" if reply[0] == "ok" else reply[1]
            return self._lost(child, structured, param)
        finally:
            self._idle.put(child if child is not None and child.process.poll() is None else None)

    def _teach(self, child: _Child, vocabulary: Vocabulary) -> _Child:
        message = ("vocabulary", vocabulary.key, vocabulary.tokenizer_json(),
                   list(vocabulary.eos_token_ids), vocabulary.vocab_size)  # fmt: skip
        if child.ask(message, VOCABULARY_TIMEOUT_S) is None:
            raise Internal("the grammar process could not load the model's vocabulary")
        child.vocabularies.add(vocabulary.key)
        return child

    def _lost(self, child: _Child, structured: StructuredOutput, param: str) -> str:
        """The error of a grammar whose process died or was killed (SIGKILL: past the budget)."""
        code = child.process.returncode
        self.restarts += 1
        timed_out = code == -9
        log.warning(
            "a grammar process %s on a %s constraint (exit status %s); another will start",
            "ran past the time budget" if timed_out else "died",
            structured.kind,
            code,
        )
        if timed_out:
            return (
                f"{param}: compiling this grammar took over {self.settings.timeout_s:g}s, this "
                f"server's limit ({PREFIX}GRAMMAR_TIMEOUT_S); simplify it"
            )
        return (
            f"{param}: the grammar engine failed on this grammar (exit status {code}); simplify it"
        )

    def close(self) -> None:
        while not self._idle.empty():
            child = self._idle.get_nowait()
            if child is not None:
                child.kill()
        self._threads.shutdown(wait=False, cancel_futures=True)


def _key(vocabulary: Vocabulary | None) -> int | None:
    return vocabulary.key if vocabulary is not None else None


_pool: GrammarPool | None = None
_pool_lock = threading.Lock()


def grammar_pool() -> GrammarPool:
    """This process's pool, its settings read from the environment on the first call (call it
    at start-up: a bad variable is then a start-up error)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = GrammarPool(GrammarSettings.from_env())
            atexit.register(_pool.close)
        return _pool
