"""How the benchmark's requests sample: `sampled` the way clients do (temperature 0.7, top_p
0.95, a seed per request), `greedy` as the correctness gate's mode and as a second row. Every
side (layerserve, transformers, llama.cpp) gets the same Sampling; what each can honour of it
is stated beside its row (transformers draws a whole batch from one generator)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from services.common.sampling import SamplingOptions


@dataclass(frozen=True, slots=True)
class Sampling:
    name: str
    temperature: float  # 0: greedy
    top_p: float

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def options(self, seeds: list[int]) -> list[SamplingOptions]:
        """One SamplingOptions per request; greedy requests carry no seed."""
        if self.greedy:
            return [SamplingOptions() for _ in seeds]
        return [
            SamplingOptions(temperature=self.temperature, top_p=self.top_p, seed=s) for s in seeds
        ]

    def describe(self) -> str:
        if self.greedy:
            return "greedy"
        return f"temperature {self.temperature:g}, top_p {self.top_p:g}, a seed per request"


SAMPLED = Sampling("sampled", temperature=0.7, top_p=0.95)
GREEDY = Sampling("greedy", temperature=0.0, top_p=1.0)
SAMPLINGS = {s.name: s for s in (SAMPLED, GREEDY)}


def request_seeds(seed: int, count: int) -> list[int]:
    """A distinct seed per request, fixed by the run's --seed: the same on every side."""
    rng = random.Random(f"sampling/{seed}")
    return [rng.randrange(2**31) for _ in range(count)]


def sampling_named(name: str) -> Sampling:
    if name not in SAMPLINGS:
        raise ValueError(f"unknown sampling {name!r}: choose from {', '.join(SAMPLINGS)}")
    return SAMPLINGS[name]
