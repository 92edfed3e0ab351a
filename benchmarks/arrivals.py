"""When each request of an L3 run is sent: all at once, or as a Poisson process."""

from __future__ import annotations

import random


def poisson_arrivals(rate: float, count: int, seed: int) -> list[float]:
    """Send times in seconds from the start for `count` requests arriving as a Poisson process
    of `rate` requests/s: exponential gaps of mean 1/rate, the first request at 0."""
    if rate <= 0:
        raise ValueError(f"arrival rate must be positive, got {rate}")
    rng = random.Random(seed)
    times, now = [], 0.0
    for i in range(count):
        if i:
            now += rng.expovariate(rate)
        times.append(now)
    return times
