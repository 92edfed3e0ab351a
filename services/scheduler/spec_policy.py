"""How many proposed tokens each request computes in a step: as many as pay for themselves.

A proposed token costs its share of the step whether the worker accepts it or not, and pays
only when accepted. Both sides move: a request copying a passage has nearly every proposal
accepted, one writing freely almost none; a step of one sequence on a GPU computes eight more
tokens for nothing, while on a CPU, or with 64 sequences, each token costs its share. So the
Speculator weighs them step by step:

- StepCost learns what a step costs: the seconds of a step of T tokens, the median of its recent
  steps for each T the scheduler has timed, made non-decreasing in T (a bigger step never costs
  less: where a size's few steps came out cheaper than a smaller size's, the two are pooled,
  weighted by their steps, so that one lucky timing of a big step does not make its proposals
  look cheap), read between those by straight lines. A step's cost is not one line in T: on
  a CPU a second row of a 4-bit matmul can be nearly free and a third not (the kernel tiles
  rows), so each T keeps its own. A T above every one timed costs
  what the last two timed say per token, or, with one timed, nothing more (proposals look
  free: their steps are then timed). A size not timed for STALE_STEPS steps is dropped, so
  that a cost measured while the machine was busier does not keep proposals off for ever.
- Acceptance: a request's chance that a proposal is accepted, from its recent steps, leaning
  toward the worker's overall rate while it has few.
- choose(): the j-th proposal of a request with acceptance p counts only if the j - 1 before it
  were accepted: it is worth p^j expected tokens. Proposals are taken best first while each
  raises the step's expected tokens per second: with E tokens expected from T tokens computed,
  one worth g is taken when (E + g) / t(T + 1) > E / t(T), i.e. g t(T) > E (t(T + 1) - t(T)).
"""

from __future__ import annotations

import bisect
import heapq
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True)
class StepCost:
    """Seconds a step of T tokens takes: the median of each T's recent steps, made
    non-decreasing in T, straight lines between the T timed."""

    # Steps of one size whose median stands for it: a median, not a mean, so that one step
    # stalled by another process (a busy CPU) does not price a size out for the next ones.
    RECENT = 9
    # Steps timed after which a size not timed since is forgotten (see the module docstring).
    STALE_STEPS = 500

    _recent: dict[int, deque[float]] = field(default_factory=dict)
    _raw: dict[int, float] = field(default_factory=dict)  # each size's median
    _medians: dict[int, float] = field(default_factory=dict)  # non-decreasing in T: _monotone
    _last: dict[int, int] = field(default_factory=dict)  # the step count when T was last timed
    _steps: int = 0
    _sizes: list[int] = field(default_factory=list)  # the T timed, ascending

    def record(self, tokens: int, seconds: float) -> None:
        self._steps += 1
        recent = self._recent.get(tokens)
        if recent is None:
            recent = self._recent[tokens] = deque(maxlen=self.RECENT)
            bisect.insort(self._sizes, tokens)
        recent.append(seconds)
        self._raw[tokens] = statistics.median(recent)
        self._last[tokens] = self._steps
        if self._steps % 64 == 0:
            self._forget_stale()
        self._monotone()

    def _forget_stale(self) -> None:
        stale = [t for t in self._sizes if self._steps - self._last[t] > self.STALE_STEPS]
        for tokens in stale:
            del self._recent[tokens], self._raw[tokens], self._last[tokens]
        self._sizes = [t for t in self._sizes if t in self._recent]

    def _monotone(self) -> None:
        """_medians: each size's median, where a larger size's falls below a smaller one's the
        run of them pooled to their mean weighted by steps timed (pool adjacent violators)."""
        blocks: list[tuple[float, int, list[int]]] = []  # (value, steps, sizes pooled)
        for tokens in self._sizes:
            value, steps, sizes = self._raw[tokens], len(self._recent[tokens]), [tokens]
            while blocks and blocks[-1][0] > value:
                below, below_steps, below_sizes = blocks.pop()
                value = (below * below_steps + value * steps) / (below_steps + steps)
                steps, sizes = below_steps + steps, below_sizes + sizes
            blocks.append((value, steps, sizes))
        self._medians = {t: value for value, _, sizes in blocks for t in sizes}

    def seconds(self, tokens: int) -> float:
        """A step of `tokens` tokens' expected seconds (0 before any step is timed)."""
        sizes, costs = self._sizes, self._medians
        if not sizes:
            return 0.0
        if tokens in costs:
            return costs[tokens]
        i = bisect.bisect(sizes, tokens)
        if 0 < i < len(sizes):  # between two sizes timed
            lo, hi = sizes[i - 1], sizes[i]
            return costs[lo] + (costs[hi] - costs[lo]) * (tokens - lo) / (hi - lo)
        if len(sizes) == 1:
            return costs[sizes[0]]
        # Beyond the sizes timed (above or below): the slope of the two nearest.
        lo, hi = (sizes[-2], sizes[-1]) if i else (sizes[0], sizes[1])
        edge = hi if i else lo
        slope = max(0.0, (costs[hi] - costs[lo]) / (hi - lo))
        return max(0.0, costs[edge] + slope * (tokens - edge))


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


# Proposals are taken only where they promise at least this much more expected tokens a second
# than the step without them: acceptance and step costs are estimates, and a proposal that
# barely pays on paper costs a verify row for nothing as often as not (one sampled stream of
# open prompts ran 7% slower than with speculation off while its proposals were ~40% accepted).
MIN_GAIN = 0.1


def choose(
    candidates: list[tuple[float, int]],
    expected_tokens: int,
    num_tokens: int,
    seconds: Callable[[int], float],
) -> list[int]:
    """How many proposals to take from each candidate (acceptance p, proposals available n) in
    a step that computes num_tokens tokens and yields expected_tokens without proposals, for a
    step of T tokens taking seconds(T): of the proposals taken best first, the count whose
    step yields the most expected tokens a second (a cost that jumps at one size and not at
    the next, as a kernel's row tiles make it, can make a third proposal pay where a second
    alone would not)."""
    order: list[int] = []  # candidate indices, best proposal first
    best = [(-p, i) for i, (p, n) in enumerate(candidates) if n > 0 and p > 0]
    heapq.heapify(best)
    counts = [0] * len(candidates)
    expected = float(expected_tokens)
    free = seconds(num_tokens) == 0  # nothing timed yet, or the fixed policy: take them all
    plain = _rate(expected, seconds(num_tokens))
    rate, cut = plain, 0
    while best:
        worth, i = heapq.heappop(best)
        order.append(i)
        expected -= worth
        counts[i] += 1
        if (now := _rate(expected, seconds(num_tokens + len(order)))) > rate:
            rate, cut = now, len(order)
        p, n = candidates[i]
        if counts[i] < n:
            heapq.heappush(best, (-(p ** (counts[i] + 1)), i))
    if not free and rate < plain * (1 + MIN_GAIN):
        cut = 0  # within the estimates' noise of a step without proposals: not worth a try
    taken = [0] * len(candidates)
    for i in order[:cut]:
        taken[i] += 1
    return taken


def _rate(expected: float, seconds: float) -> float:
    """Expected tokens a second; a free step (nothing timed yet) makes more tokens better."""
    return expected / seconds if seconds > 0 else expected
