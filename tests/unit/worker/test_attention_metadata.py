"""lay_out (attention_metadata.py): a small step's positions and slots from Python lists equal
the vectorised torch ops that longer steps take."""

from __future__ import annotations

import random

import pytest
import torch

from services.worker.layers import attention_metadata
from services.worker.layers.attention_metadata import lay_out

CPU = torch.device("cpu")


def _layout(seed: int) -> tuple[list[int], list[int], list[list[int]], int]:
    """Decodes and prefill chunks after cached prefixes, shuffled blocks, some sequences with
    their first blocks dropped (-1) as a sliding-window group leaves them."""
    rng = random.Random(seed)
    block = rng.choice([1, 4, 16])
    pool = list(range(400))
    rng.shuffle(pool)
    query_lens, context_lens, tables = [], [], []
    for _ in range(rng.randint(1, 6)):
        query = rng.choice([1, 1, 3, 17])
        context = query + rng.randint(0, 40)
        count = -(-context // block)
        table, pool = pool[:count], pool[count:]
        dropped = rng.randint(0, max(0, (context - query) // block))
        query_lens.append(query)
        context_lens.append(context)
        tables.append([-1] * dropped + table[dropped:])
    return query_lens, context_lens, tables, block


@pytest.mark.parametrize("seed", range(12))
def test_small_steps_lay_out_as_the_vectorised_path(seed, monkeypatch) -> None:
    query_lens, context_lens, tables, block = _layout(seed)
    small, small_tables = lay_out(query_lens, context_lens, tables, block, CPU)
    monkeypatch.setattr(attention_metadata, "SMALL_STEP_TOKENS", 0)
    large, large_tables = lay_out(query_lens, context_lens, tables, block, CPU)
    assert torch.equal(small_tables, large_tables)
    for name in ("query_start", "block_tables", "slot_mapping", "positions"):
        assert torch.equal(getattr(small, name), getattr(large, name)), name
        assert getattr(small, name).dtype == torch.int64
    # A decode's slot is where its position lies in its own block table.
    last = small.slot_mapping[int(small.query_start[1]) - 1]
    position = context_lens[0] - 1
    assert int(last) == tables[0][position // block] * block + position % block
