"""How many proposed tokens each request computes in a step: as many as pay for themselves.

A proposed token costs its share of the step whether the worker accepts it or not, and pays
only when accepted. Both sides move: a request copying a passage has nearly every proposal
accepted, one writing freely almost none; a step of one sequence on a GPU computes eight more
tokens for nothing, while on a CPU, or with 64 sequences, each token costs its share. So the
Speculator weighs them step by step:

- StepCost learns what a step costs: seconds as a line in its tokens, t = a + b T, fitted to
  the steps timed so far (least squares, older steps weighing less). Where the steps' sizes
  spread too little to tell a slope, b leans toward 0 (proposals look free): speculation then
  goes on, and its steps show the slope again.
- Acceptance: a request's chance that a proposal is accepted, from its recent steps, leaning
  toward the worker's overall rate while it has few.
- choose(): the j-th proposal of a request with acceptance p counts only if the j - 1 before it
  were accepted: it is worth p^j expected tokens. Proposals are taken best first while each
  raises the step's expected tokens per second: with E tokens expected from T tokens computed,
  one worth g is taken when (E + g) / t(T + 1) > E / t(T), i.e. g t(T) > E b.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepCost:
    """Seconds per step as a + b x tokens, fitted to recent steps."""

    # Each step timed weighs `decay` times the one after it (about the last 50 steps count).
    decay: float = 0.98
    # Pulls the slope toward 0 as this many tokens' squared spread would: with steps of a
    # spread of a few tokens the data decides, with none the slope fades to 0.
    ridge: float = 8.0
    # Weighted sums over the steps timed: count, tokens, tokens^2, seconds, tokens x seconds.
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)

    def record(self, tokens: int, seconds: float) -> None:
        n, st, stt, sy, sty = (value * self.decay for value in self._sums)
        self._sums = [
            n + 1,
            st + tokens,
            stt + tokens * tokens,
            sy + seconds,
            sty + tokens * seconds,
        ]

    def line(self) -> tuple[float, float]:
        """(a, b): the fixed seconds of a step and the seconds each token adds (0, 0 before any
        step is timed). Neither is negative."""
        n, st, stt, sy, sty = self._sums
        if n == 0:
            return 0.0, 0.0
        slope = (n * sty - st * sy) / (n * stt - st * st + self.ridge * n)
        b = max(0.0, slope)
        return max(0.0, (sy - b * st) / n), b


@dataclass(slots=True)
class Acceptance:
    """The chance a proposal is accepted: a request's own record (recent steps weigh more)
    blended with the worker's overall one (the prior, worth PRIOR_WEIGHT trials)."""

    # A request's record shrinks by this factor each step it could speculate, so that its
    # recent steps count most (it may have started or ended a quote), and a request whose
    # proposals stopped paying tries one again now and then.
    REQUEST_DECAY = 0.95
    # The worker's record shrinks by this each step: after a long spell without proposals the
    # overall rate drifts back to 1/2.
    OVERALL_DECAY = 0.98
    PRIOR_WEIGHT = 1.0

    accepted: float = 0.0
    trials: float = 0.0

    def rate(self, prior: float) -> float:
        return (self.accepted + self.PRIOR_WEIGHT * prior) / (self.trials + self.PRIOR_WEIGHT)

    def overall_rate(self) -> float:
        """As the prior itself: Laplace's rule, 1/2 with no record."""
        return (self.accepted + 1.0) / (self.trials + 2.0)

    def forget(self, factor: float) -> None:
        self.accepted *= factor
        self.trials *= factor

    def add(self, num_drafts: int, num_accepted: int) -> None:
        """A step verified num_drafts proposals and accepted the first num_accepted: each
        accepted one was a trial that succeeded, and the first rejected one (if any) a trial
        that failed; those after it were never tried."""
        self.accepted += num_accepted
        self.trials += num_accepted + (num_accepted < num_drafts)


def choose(
    candidates: list[tuple[float, int]],
    expected_tokens: int,
    num_tokens: int,
    cost: tuple[float, float],
) -> list[int]:
    """How many proposals to take from each candidate (acceptance p, proposals available n) in
    a step that computes num_tokens tokens and yields expected_tokens without proposals, for a
    step cost (a, b)."""
    a, b = cost
    taken = [0] * len(candidates)
    best = [(-p, i) for i, (p, n) in enumerate(candidates) if n > 0 and p > 0]
    heapq.heapify(best)
    expected = float(expected_tokens)
    while best:
        worth, i = heapq.heappop(best)
        worth = -worth
        if worth * (a + b * num_tokens) < expected * b:
            break  # the best left does not pay: nor does any other
        taken[i] += 1
        expected += worth
        num_tokens += 1
        p, n = candidates[i]
        if taken[i] < n:
            heapq.heappush(best, (-(p ** (taken[i] + 1)), i))
    return taken
