"""Benchmark workloads: pre-tokenised prompts with fixed output lengths, seeded."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Item:
    prompt_ids: list[int]
    output_len: int


def uniform_workload(
    count: int,
    input_range: tuple[int, int],
    output_range: tuple[int, int],
    seed: int = 0,
    vocab: tuple[int, int] = (1000, 40000),
) -> list[Item]:
    """`count` prompts of random token ids (lengths uniform in input_range) and output lengths
    uniform in output_range. Random ids avoid special tokens; EOS is ignored when serving."""
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        length = rng.randint(*input_range)
        items.append(Item([rng.randint(*vocab) for _ in range(length)], rng.randint(*output_range)))
    return items


def describe(items: list[Item]) -> str:
    inputs = sum(len(i.prompt_ids) for i in items)
    outputs = sum(i.output_len for i in items)
    return f"{len(items)} requests, {inputs} prompt tokens, {outputs} output tokens"
