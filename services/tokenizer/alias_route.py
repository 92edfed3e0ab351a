"""How an alias picks the model that serves a request: by weight or by prompt length.

The scheduler owns the alias table and publishes it; the tokenizer service resolves aliases
because only it knows a prompt's length in tokens. Each route is a small state machine kept
across table refreshes as long as its definition does not change (see ModelCatalog).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class WeightedRoute:
    """Smooth weighted round robin (nginx's): each pick adds every target's weight to its
    credit, takes the target with the most credit and charges it the total. With weights
    reduced by their gcd, the picks repeat with period sum(weights): every run of that many
    consecutive requests splits exactly by weight (90/10: 9 and 1 of every 10), and the minority
    target's requests are spread out, never bunched. Deterministic, so tests are exact."""

    __slots__ = ("targets", "_credit")

    def __init__(self, targets: list[tuple[str, int]]) -> None:
        divisor = math.gcd(*(w for _, w in targets))
        self.targets = tuple((model, w // divisor) for model, w in targets)  # weights > 0
        self._credit = [0] * len(targets)

    @property
    def models(self) -> list[str]:
        return [m for m, _ in self.targets]

    @property
    def first(self) -> str:
        return self.targets[0][0]

    def pick(self) -> str:
        total = 0
        for i, (_, weight) in enumerate(self.targets):
            self._credit[i] += weight
            total += weight
        best = max(range(len(self.targets)), key=self._credit.__getitem__)  # first on ties
        self._credit[best] -= total
        return self.targets[best][0]

    def same_as(self, other: object) -> bool:
        return isinstance(other, WeightedRoute) and other.targets == self.targets


@dataclass(frozen=True, slots=True)
class LengthRoute:
    """Prompts of at most tier[i].max_prompt_tokens tokens go to tier i's model (the first tier
    that fits); the last tier (limit 0) takes the rest. The length is counted with the FIRST
    tier's tokenizer and chat template: tokenizers differ, and the rule must be decided before
    knowing the target; the request is then tokenized again for its target if that differs."""

    tiers: tuple[tuple[int, str], ...]  # (max_prompt_tokens, model); the last has 0

    @property
    def models(self) -> list[str]:
        return [m for _, m in self.tiers]

    @property
    def first(self) -> str:
        """The model whose tokenizer measures the prompt."""
        return self.tiers[0][1]

    def pick(self, num_prompt_tokens: int) -> str:
        for limit, model in self.tiers:
            if limit == 0 or num_prompt_tokens <= limit:
                return model
        return self.tiers[-1][1]

    def same_as(self, other: object) -> bool:
        return isinstance(other, LengthRoute) and other.tiers == self.tiers


AliasRoute = WeightedRoute | LengthRoute
