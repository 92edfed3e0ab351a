"""The progress bar of `layerserve bench`, on stderr: one tick per timed run, whatever the
level, so the bar's total is known before the first model is loaded."""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    def __init__(self, total: int, enabled: bool = True) -> None:
        self._bar = tqdm(
            total=total, file=sys.stderr, unit="run", disable=not enabled, dynamic_ncols=True
        )

    def stage(self, text: str) -> None:
        """What runs now (shown beside the bar)."""
        self._bar.set_description_str(text, refresh=True)

    def advance(self, runs: int = 1) -> None:
        self._bar.update(runs)

    def note(self, text: str) -> None:
        """A line above the bar that stays (a result, a skipped baseline)."""
        self._bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self._bar.close()
