"""Stop strings over streamed text, with OpenAI semantics.

A stop string may arrive split across tokens and across deltas, so text that could be the
start of a stop string is held back until the next delta decides it. When a stop string
appears, it and everything after it are dropped and generation is finished.
"""

from __future__ import annotations

from collections.abc import Iterable


class StopChecker:
    """Feed text deltas in order; emit only text that can no longer become part of a stop.

    Contract: the concatenation of everything `feed` and `flush` return equals the fed text
    cut just before the earliest occurrence of any stop string (or all of it when none
    occurs). Each call costs O(len(delta) + longest stop) per stop string: at most
    len(longest stop) - 1 characters are ever held. Empty stop strings are ignored. One
    instance per request; not thread-safe.
    """

    def __init__(self, stop_strings: Iterable[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stop_strings if s))
        self._max_held = max((len(s) for s in self._stops), default=1) - 1
        self._held = ""
        self.finished = False
        # The stop string that ended generation, for finish details (vLLM's stop_reason).
        self.matched: str | None = None

    def feed(self, delta: str) -> tuple[str, bool]:
        """Returns (text safe to emit now, finished). After finishing, returns ("", True)."""
        if self.finished:
            return "", True
        text = self._held + delta
        hit = self._earliest_stop(text)
        if hit is not None:
            index, self.matched = hit
            self.finished, self._held = True, ""
            return text[:index], True
        keep = self._partial_stop_length(text)
        self._held = text[len(text) - keep :]
        return text[: len(text) - keep], False

    def flush(self) -> str:
        """Generation ended without a stop string: release the held-back text."""
        held, self._held = self._held, ""
        return "" if self.finished else held

    def _earliest_stop(self, text: str) -> tuple[int, str] | None:
        """(index, stop) of the first stop occurrence in `text`, or None."""
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = text.find(stop)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _partial_stop_length(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop.

        The longest one is the earliest place a stop could still begin, so everything before
        it is safe to emit.
        """
        for length in range(min(len(text), self._max_held), 0, -1):
            suffix = text[-length:]
            if any(stop.startswith(suffix) for stop in self._stops):
                return length
        return 0
