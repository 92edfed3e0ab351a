"""A tiny random Gemma 3 saved by transformers, loaded through the registry's Hugging Face path,
against transformers' own forward pass. It exercises what Gemma 3 270M leaves at its defaults:
a query scale other than head_dim, linear RoPE scaling on global layers, a local RoPE base,
final-logit soft-capping, grouped KV heads and a window shorter than the prompt."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from benchmarks.offline import OfflineEngine
from services.scheduler.scheduler import SchedulerLimits
from services.worker.engine.model_runner import ModelRunner
from services.worker.layers.attention import StepAttention
from services.worker.layers.attention_backends import torch_backend
from services.worker.layers.kv_cache import PagedKVCache, kv_cache_groups
from services.worker.model.gemma3 import Gemma3Model
from services.worker.model.gemma3_config import Gemma3Config
from services.worker.model.loader import LoadedModel, load_model
from tests.reference_models import greedy_generate
from tests.reference_models.dense_kv import DenseKV
from tests.reference_models.gemma3_reference import dense_hidden, dense_logits
from tests.unit.worker.plan_driver import Driver

transformers = pytest.importorskip("transformers")
TOKENS = [2, 17, 33, 5, 60, 41, 8, 12, 29, 50, 3, 44, 9]
BLOCK = 4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, LoadedModel]:
    """(transformers' model, ours loaded from its saved checkpoint)."""
    config = transformers.Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=4,
        query_pre_attn_scalar=24, final_logit_softcapping=5.0, max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"] * 2,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
        },
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for param in hf.parameters():  # norms start at zero; make every (1 + w) count
            param.normal_(0.0, 0.3)
    directory = tmp_path_factory.mktemp("tiny-gemma3")
    hf.save_pretrained(directory)
    return hf, load_model(Path(directory), dtype=torch.float32, device=torch.device("cpu"))


def _hf_logits(hf: Any) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([TOKENS])).logits[0].float()  # [T, V]


def test_config_read_from_the_checkpoint(tiny: tuple[Any, LoadedModel]) -> None:
    config = tiny[1].config
    assert isinstance(config, Gemma3Config) and isinstance(tiny[1].model, Gemma3Model)
    assert (config.query_pre_attn_scalar, config.rope_linear_factor) == (24.0, 2.0)
    assert (config.rope_local_theta, config.final_logit_softcapping) == (100.0, 5.0)
    assert config.window(0) == 4 and config.window(1) is None


def test_paged_engine_matches_transformers(tiny: tuple[Any, LoadedModel]) -> None:
    """Prefill in two chunks, then one decode token, through the paged cache."""
    hf, loaded = tiny
    model: Gemma3Model = loaded.model  # type: ignore[assignment]
    cache = PagedKVCache(loaded.config, 16, BLOCK, torch.float32, torch.device("cpu"))
    table = [7, 2, 11, 5]  # shuffled on purpose
    logits = []
    with torch.inference_mode():
        for start, end in ((0, 7), (7, 12), (12, 13)):
            tables = [[table[: -(-end // BLOCK)]]]  # one KV cache group, one sequence
            attn = StepAttention.build([end - start], [end], tables, BLOCK, torch.device("cpu"))
            ids = torch.tensor(TOKENS[start:end])
            logits.append(model.compute_logits(model(ids, attn.positions, attn, cache)))
    torch.testing.assert_close(torch.cat(logits), _hf_logits(hf), atol=1e-4, rtol=1e-4)


def test_dense_reference_matches_transformers(tiny: tuple[Any, LoadedModel]) -> None:
    hf, loaded = tiny
    kv = DenseKV(loaded.config.num_layers)
    ours = dense_logits(loaded.model, dense_hidden(loaded.model, TOKENS, kv))  # type: ignore[arg-type]
    theirs = _hf_logits(hf)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    assert theirs.abs().max() <= 5.0, "soft-capping bounds the logits"


def test_float16_is_refused_with_a_clear_error(tiny: tuple[Any, LoadedModel]) -> None:
    with pytest.raises(ValueError, match="overflows float16; use --dtype bfloat16"):
        Gemma3Model(tiny[1].config, dtype=torch.float16)  # type: ignore[arg-type]


def test_grouped_cache_frees_sliding_blocks_and_generates_the_same_tokens(
    tiny: tuple[Any, LoadedModel],
) -> None:
    """As served: the global and sliding layers in their own KV cache groups, blocks behind
    the window of 4 handed back while two sequences prefill in chunks of 3 and decode."""
    _, loaded = tiny
    prompts = [TOKENS, TOKENS[5:] + [7, 7, 1]]
    expected = [greedy_generate(loaded, prompt, 10) for prompt in prompts]
    groups = kv_cache_groups(loaded.config)
    assert [g.window for g in groups] == [None, 4]
    cache = PagedKVCache(loaded.config, 32, BLOCK, torch.float32, torch.device("cpu"), groups)
    runner = ModelRunner(
        loaded, cache, max_model_len=64, model_name="tiny-gemma3", backend=torch_backend()
    )
    driver = Driver(runner, chunk=3)
    for i, prompt in enumerate(prompts):
        driver.add(f"r{i}", prompt)
    outputs = driver.run(10)
    assert [outputs["r0"], outputs["r1"]] == expected
    for seq in driver.seqs.values():
        full, sliding = seq.tables
        assert -1 not in full and len(full) == -(-seq.num_computed // BLOCK)
        kept = [b for b in sliding if b != -1]
        assert len(sliding) == len(full) and sliding[: len(sliding) - len(kept)] == [-1] * (
            len(sliding) - len(kept)
        )
        assert len(kept) <= 2, "a window of 4 tokens spans at most 2 blocks of 4"
    full_blocks = sum(len(s.tables[0]) for s in driver.seqs.values())  # 11
    assert driver.num_held <= full_blocks + 2 * len(prompts) < 2 * full_blocks


def test_the_scheduler_drives_grouped_gemma_with_prefix_reuse_and_preemption(
    tiny: tuple[Any, LoadedModel],
) -> None:
    """The real scheduler over the grouped cache: a request reusing a cached prefix longer than
    the window starts with -1 sliding entries; a pool too small for all at once preempts; every
    output equals the dense reference and every block comes back."""
    _, loaded = tiny
    groups = kv_cache_groups(loaded.config)
    prompts = [TOKENS + [4, 4, 4], TOKENS + [9, 1], TOKENS[:10], TOKENS[3:] + [2]]
    expected = [greedy_generate(loaded, prompt, 12) for prompt in prompts]
    cache = PagedKVCache(loaded.config, 16, BLOCK, torch.float32, torch.device("cpu"), groups)
    runner = ModelRunner(
        loaded, cache, max_model_len=64, model_name="tiny-gemma3", backend=torch_backend()
    )
    engine = OfflineEngine(runner, SchedulerLimits(max_num_batched_tokens=6, max_num_seqs=4))
    first = engine.generate(prompts[:1], [12])
    assert first["r0"] == expected[0]
    outputs = engine.generate(prompts[1:], [12] * 3)
    assert [outputs[f"r{i}"] for i in range(3)] == expected[1:]
    scheduler = engine.scheduler
    assert scheduler.stats.num_prefix_hit_tokens >= 3 * BLOCK, "the shared 13 tokens were reused"
    assert scheduler.stats.num_preemptions > 0, "16 blocks cannot hold all three at once"
    assert scheduler.kv.pool.num_free == scheduler.kv.pool.num_blocks
