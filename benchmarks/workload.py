"""Benchmark workloads: pre-tokenised prompts with fixed output lengths, seeded.

The project's named benchmark workloads at a given Scale: `mixed` (a), `fixed` (b),
`prefill-heavy` and `decode-heavy` (c), `shared-prefix` (d), `long-context` (e: every
stream in flight at once, so the KV read dominates the step), and `single-stream` (one
request at a time: every side runs it with one request in flight, see `in_flight`). A
workload's lengths depend on (name, scale, seed) only; its token ids also on `variant`, so
that repeated runs against a server with a prefix cache can send fresh prompts of the very
same shape."""

from __future__ import annotations

import random
from dataclasses import dataclass

from benchmarks.scales import Range, Scale

WORKLOADS = (
    "mixed", "fixed", "prefill-heavy", "decode-heavy", "shared-prefix", "long-context",
    "single-stream",
)  # fmt: skip
VOCAB = (1000, 40000)  # random ids from here avoid SmolLM2's special tokens


@dataclass(frozen=True, slots=True)
class Item:
    prompt_ids: list[int]
    output_len: int


def uniform_workload(
    count: int,
    input_range: tuple[int, int],
    output_range: tuple[int, int],
    seed: int = 0,
    vocab: tuple[int, int] = VOCAB,
) -> list[Item]:
    """`count` prompts of random token ids (lengths uniform in input_range) and output lengths
    uniform in output_range. Random ids avoid special tokens; EOS is ignored when serving."""
    rng = random.Random(seed)
    items = []
    for _ in range(count):
        length = rng.randint(*input_range)
        items.append(Item([rng.randint(*vocab) for _ in range(length)], rng.randint(*output_range)))
    return items


def build_workload(name: str, scale: Scale, seed: int, variant: int = 0) -> list[Item]:
    """`scale.requests` items of the named workload (`scale.long_streams` for long-context).
    Same (name, scale, seed): same lengths; same variant too: same token ids. Every
    shared-prefix item starts with one common `scale.prefix_len`-token prefix (one per
    variant)."""
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
    shapes = _shapes(name, scale, random.Random(f"{name}/{scale.name}/{seed}"))
    ids = random.Random(f"{name}/{scale.name}/{seed}/{variant}")
    prefix = _tokens(ids, scale.prefix_len) if name == "shared-prefix" else []
    return [Item(prefix + _tokens(ids, length), out) for length, out in shapes]


def _shapes(name: str, scale: Scale, rng: random.Random) -> list[tuple[int, int]]:
    """(own prompt length, output length) per item; shared-prefix lengths exclude the prefix."""
    fixed: dict[str, Range] = {
        "fixed": scale.fixed,
        "prefill-heavy": scale.prefill_heavy,
        "decode-heavy": scale.decode_heavy,
    }
    if name in fixed:
        return [fixed[name]] * scale.requests
    if name == "single-stream":
        return [scale.single] * scale.single_requests
    if name == "shared-prefix":
        return [
            (rng.randint(*scale.prefix_suffix), scale.prefix_out) for _ in range(scale.requests)
        ]
    if name == "long-context":
        return [(rng.randint(*scale.long_in), scale.long_out) for _ in range(scale.long_streams)]
    return [
        (rng.randint(*scale.mixed_in), rng.randint(*scale.mixed_out)) for _ in range(scale.requests)
    ]


def in_flight(name: str, scale: Scale) -> int:
    """Requests a side may have in flight at once on the named workload: one for
    single-stream, else the scale's max_num_seqs (every side gets the same budget)."""
    return 1 if name == "single-stream" else scale.max_num_seqs


def _tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randint(*VOCAB) for _ in range(count)]


def describe(items: list[Item]) -> str:
    inputs = sum(len(i.prompt_ids) for i in items)
    outputs = sum(i.output_len for i in items)
    return f"{len(items)} requests, {inputs} prompt tokens, {outputs} output tokens"
