"""Tensor parallelism on the CPU: the tiny Llama split over two real processes (gloo) generates
exactly what one process does, and a model whose heads do not split fails up front."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from services.common.sampling import SamplingOptions
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import RunningSequence, StepPlan
from services.worker.model.config import LlamaConfig
from services.worker.model.llama import LlamaModel
from services.worker.model.tensor_parallel import shard_config, shard_model
from services.worker.serving.tp_launch import start_tensor_parallel
from services.worker.serving.tp_rank import RankSpec
from tests.e2e.tiny_llama import CONFIG
from tests.unit.worker.plan_driver import Driver

BLOCK_SIZE, NUM_BLOCKS, MAX_NEW = 4, 96, 10
SEEDED = SamplingOptions(temperature=0.8, seed=1234)


def _spec(path: Path | None, world_size: int) -> RankSpec:
    return RankSpec(
        world_size=world_size,
        model_path=str(path) if path else None,
        model_name="tiny-tp",
        device="cpu",
        dtype="float32",
        block_size=BLOCK_SIZE,
        num_blocks=NUM_BLOCKS,
        kv_cache_bytes=1 << 20,
        max_model_len=None,
        kernels="torch",
        threads=1,  # two ranks share the test machine's cores
    )


def _generate(runner: ModelRunner) -> dict[str, list[int]]:
    """A batch of prompts of different lengths, prefilled in chunks beside running decodes
    (small blocks: every sequence spans several), with a preemption and a late arrival."""
    driver = Driver(runner, chunk=6)
    driver.add("long", [(7 * i) % 4000 + 3 for i in range(23)])
    driver.add("short", [11, 12, 13])
    driver.add("one", [42])
    driver.add("seeded", list(range(300, 314)), SEEDED)
    for _ in range(5):
        driver.step(MAX_NEW)
    driver.preempt("long")  # forgotten by every rank, then re-sent with its output so far
    driver.add("late", list(range(900, 909)))
    return driver.run(MAX_NEW)


def test_two_ranks_generate_what_one_process_does(tiny_dir: Path) -> None:
    single = ModelRunner.create(
        path=tiny_dir, num_blocks=NUM_BLOCKS, block_size=BLOCK_SIZE, kernels="torch"
    )
    expected = _generate(single)
    # Pools other tests left in this process (grammar checks, JSON parsing) are not ranks.
    before = set(multiprocessing.active_children())
    runner = start_tensor_parallel(_spec(tiny_dir, 2))
    try:
        assert (runner.tensor_parallel_size, runner.num_blocks) == (2, NUM_BLOCKS)
        # A plan rank 0 rejects is rejected by rank 1 too: the ranks stay in step.
        with pytest.raises(ValueError, match="unknown to the worker"):
            runner.execute(StepPlan(running=[RunningSequence("nobody", 1, [[]])]))
        actual = _generate(runner)
    finally:
        runner.close()
    assert actual == expected
    assert all(len(tokens) == MAX_NEW for tokens in actual.values())
    assert set(multiprocessing.active_children()) <= before  # close() stopped rank 1


def test_heads_that_do_not_split_are_a_clear_error(tmp_path: Path) -> None:
    # SmolLM2-135M's shape: 9 attention heads, 3 KV heads (only config.json is read).
    config = {**CONFIG, "hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3}
    (tmp_path / "config.json").write_text(json.dumps(config))
    before = set(multiprocessing.active_children())
    with pytest.raises(ValueError, match="tensor-parallel size 2 does not divide the model's 9"):
        start_tensor_parallel(_spec(tmp_path, 2))
    assert set(multiprocessing.active_children()) <= before  # refused before starting any rank
    smollm = _config(num_heads=9, num_kv_heads=3, intermediate_size=1536)
    assert shard_config(smollm, 3).num_kv_heads == 1  # 3 ranks do split it

    model = LlamaModel(_config(num_heads=4, num_kv_heads=4, intermediate_size=30))
    with pytest.raises(ValueError, match="does not divide the model's 30 MLP columns"):
        shard_model(model, rank=0, world_size=4)


def _config(num_heads: int, num_kv_heads: int, intermediate_size: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=intermediate_size,
        num_layers=1,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=8,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        eos_token_ids=(0,),
    )
