"""KV cache groups on the worker: Gemma 3's layers split into one global and five sliding-window
groups drawing from one block pool, each layer reading through its own group's block tables,
and plans checked per group (a sliding group may drop blocks the window left behind, nothing
else may)."""

from __future__ import annotations

import pytest
import torch

from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan
from services.worker.engine.sequences import PlanLimits, SequenceState, validate_plan
from services.worker.layers.kv_cache import (
    KVCacheGroup,
    PagedKVCache,
    kv_cache_groups,
    num_blocks_for_bytes,
)
from services.worker.model.config import LlamaConfig
from services.worker.model.gemma3_config import Gemma3Config, pattern_layer_types

SHAPE = dict(
    vocab_size=262144, hidden_size=640, intermediate_size=2048, num_layers=18, num_heads=4,
    num_kv_heads=1, head_dim=256, rope_theta=1e6, rms_norm_eps=1e-6,
    max_position_embeddings=32768, tie_word_embeddings=True, eos_token_ids=(1,),
)  # fmt: skip
GEMMA_270M = Gemma3Config(**SHAPE, layer_types=pattern_layer_types(18, 6), sliding_window=512)
LLAMA = LlamaConfig(**SHAPE)
CPU = torch.device("cpu")


def test_gemma3_270m_has_one_global_and_five_sliding_groups_of_three_layers() -> None:
    assert kv_cache_groups(GEMMA_270M) == [
        KVCacheGroup((5, 11, 17), None),
        KVCacheGroup((0, 1, 2), 512),
        KVCacheGroup((3, 4, 6), 512),
        KVCacheGroup((7, 8, 9), 512),
        KVCacheGroup((10, 12, 13), 512),
        KVCacheGroup((14, 15, 16), 512),
    ]
    assert kv_cache_groups(LLAMA) == [KVCacheGroup(tuple(range(18)), None)]


def test_a_block_holds_one_groups_layers_so_the_same_bytes_hold_six_times_the_blocks() -> None:
    groups = kv_cache_groups(GEMMA_270M)
    budget = 1 << 30
    whole = num_blocks_for_bytes(GEMMA_270M, 16, torch.float32, budget)
    grouped = num_blocks_for_bytes(GEMMA_270M, 16, torch.float32, budget, groups)
    assert whole == budget // (2 * 18 * 16 * 256 * 4)
    assert grouped == budget // (2 * 3 * 16 * 256 * 4) and grouped >= 6 * whole


def test_a_block_holds_the_layers_of_the_group_it_was_given_to() -> None:
    config = Gemma3Config(**{**SHAPE, "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
                             "num_layers": 4, "head_dim": 2},
                          layer_types=pattern_layer_types(4, 2), sliding_window=4)  # fmt: skip
    groups = kv_cache_groups(config)  # [(1, 3) global, (0, 2) sliding]
    cache = PagedKVCache(config, 3, 2, torch.float32, CPU, groups)
    assert [cache.group_of(layer) for layer in range(4)] == [1, 0, 1, 0]
    k = torch.ones(1, 1, 2)
    for layer, slot in ((1, 2), (3, 2), (0, 4), (2, 4)):  # global group: block 1, sliding: 2
        cache.write(layer, k * (layer + 1), k, torch.tensor([slot]))
    keys = [cache.layer(layer)[0][:, 0, 0, 0].tolist() for layer in range(4)]
    assert keys == [[0, 2, 1], [0, 2, 1], [0, 4, 3], [0, 4, 3]]  # one slice per layer position
    with pytest.raises(ValueError, match="same number of layers"):
        PagedKVCache(config, 3, 2, torch.float32, CPU, [groups[0], KVCacheGroup((0,)), groups[1]])


LIMITS = PlanLimits(block_size=4, num_blocks=16, max_model_len=64, vocab_size=100,
                    windows=(None, 6))  # fmt: skip


def _new(computed: int, full: list[int], sliding: list[int], new: int = 2) -> StepPlan:
    tokens = list(range(1, computed + new + 1))
    seq = NewSequence("r", tokens, len(tokens), computed, new, [full, sliding])
    return StepPlan(new=[seq])


def test_a_sliding_group_may_drop_blocks_before_the_first_querys_window_only() -> None:
    # First query at position 12 sees keys 7..12: blocks 0 (0-3) and 1 (4-7) are needed from 1.
    validate_plan(_new(12, [0, 1, 2, 3], [-1, 5, 6, 7]), {}, LIMITS)
    with pytest.raises(
        ValueError, match=r"block id -1 not in \[0, 16\) \(KV cache group 1, block 1\)"
    ):
        validate_plan(_new(12, [0, 1, 2, 3], [-1, -1, 6, 7]), {}, LIMITS)
    with pytest.raises(ValueError, match=r"block id -1 not in \[0, 16\) \(KV cache group 0"):
        validate_plan(_new(12, [-1, 1, 2, 3], [-1, 5, 6, 7]), {}, LIMITS)
    with pytest.raises(ValueError, match="cannot hold 14 tokens \\(KV cache group 1\\)"):
        validate_plan(_new(12, [0, 1, 2, 3], [-1, 5, 6]), {}, LIMITS)


def test_plans_must_carry_a_table_for_every_group() -> None:
    plan = _new(0, [0], [1])
    plan.new[0].block_tables = [[0]]
    with pytest.raises(ValueError, match="1 block tables for 2 KV cache groups"):
        validate_plan(plan, {}, LIMITS)
    held = {"r": SequenceState("r", [1, 2, 3], 3, 2, [[0], [1]], None)}  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1 block tables for 2 KV cache groups"):
        validate_plan(StepPlan(running=[RunningSequence("r", 1, [[]])]), held, LIMITS)
    validate_plan(StepPlan(running=[RunningSequence("r", 1, [[], []])]), held, LIMITS)
