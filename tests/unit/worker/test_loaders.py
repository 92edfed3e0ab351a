"""Weight loading: the GGUF q/k permutation fix, and Hugging Face checkpoint directories."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer

from services.common.sampling import SamplingOptions
from services.worker.engine.model_runner import ModelRunner
from services.worker.model.config import Llama3RopeScaling, LlamaConfig, rope_inv_freq
from services.worker.model.gguf_loader import gguf_to_hf_rows, hf_to_gguf_rows
from services.worker.model.loader import LoadedModel, load_model
from tests.reference_models import greedy_generate
from tests.reference_models.llama_reference import dense_hidden, dense_logits
from tests.unit.worker.conftest import RunnerFactory
from tests.unit.worker.plan_driver import Driver

CHAT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_permutation_helpers_are_inverse() -> None:
    weight = torch.arange(6 * 8 * 3, dtype=torch.float32).reshape(48, 3).numpy()
    assert (gguf_to_hf_rows(hf_to_gguf_rows(weight, 6), 6) == weight).all()
    assert not (hf_to_gguf_rows(weight, 6) == weight).all()


def test_gguf_config(smollm: LoadedModel) -> None:
    c = smollm.config
    assert (c.num_layers, c.hidden_size, c.intermediate_size) == (30, 576, 1536)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == (9, 3, 64, 49152)
    assert c.tie_word_embeddings and c.rope_theta == 100000.0
    assert smollm.model.lm_head is None


def test_chat_answer_mentions_paris(make_runner: RunnerFactory, tokenizer: Tokenizer) -> None:
    driver = Driver(make_runner())
    driver.add("chat", tokenizer.encode(CHAT).ids, SamplingOptions())
    answer = tokenizer.decode(driver.run(12)["chat"])
    assert "Paris" in answer, answer


def _mean_nll(smollm: LoadedModel, ids: list[int]) -> float:
    logits = dense_logits(smollm.model, dense_hidden(smollm.model, ids))
    return F.cross_entropy(logits[:-1], torch.tensor(ids[1:])).item()


def test_long_text_loss_needs_the_permutation_undone(
    smollm: LoadedModel, tokenizer: Tokenizer
) -> None:
    """Mean next-token NLL over ~1000 tokens of English: HF order clearly beats GGUF order."""
    text = (Path(__file__).parent / "data" / "long_text.txt").read_text()
    ids = tokenizer.encode(text).ids
    assert 900 <= len(ids) <= 1200
    correct = _mean_nll(smollm, ids)
    config = smollm.config
    saved = [layer.self_attn.qkv_proj.detach().clone() for layer in smollm.model.layers]
    try:  # Put q/k rows back in llama.cpp's order, as a loader without the fix would.
        for layer in smollm.model.layers:
            qkv = layer.self_attn.qkv_proj.data
            q, k = qkv[: config.q_size], qkv[config.q_size : config.q_size + config.kv_size]
            q.copy_(torch.from_numpy(hf_to_gguf_rows(q.numpy().copy(), config.num_heads)))
            k.copy_(torch.from_numpy(hf_to_gguf_rows(k.numpy().copy(), config.num_kv_heads)))
        unfixed = _mean_nll(smollm, ids)
    finally:
        for layer, weight in zip(smollm.model.layers, saved, strict=True):
            layer.self_attn.qkv_proj.data.copy_(weight)
    assert correct < 3.5, f"a 135M model should read plain English better (NLL {correct:.2f})"
    assert unfixed > correct + 1.0, (correct, unfixed)


# --- Hugging Face directories -------------------------------------------------------------

TINY = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 64,
    "intermediate_size": 112, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "max_position_embeddings": 256, "tie_word_embeddings": False, "eos_token_id": 5,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
}  # fmt: skip


TINY_CONFIG = dict(
    vocab_size=96, hidden_size=64, intermediate_size=112, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=16, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=256, tie_word_embeddings=False, eos_token_ids=(5,),
)  # fmt: skip


def _tiny_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    d, ffn, v, hd = 64, 112, 96, 16
    shapes = {
        "model.embed_tokens.weight": (v, d),
        "model.norm.weight": (d,),
        "lm_head.weight": (v, d),
    }
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (4 * hd, d), p + "self_attn.k_proj.weight": (2 * hd, d),
            p + "self_attn.v_proj.weight": (2 * hd, d), p + "self_attn.o_proj.weight": (d, 4 * hd),
            p + "mlp.gate_proj.weight": (ffn, d), p + "mlp.up_proj.weight": (ffn, d),
            p + "mlp.down_proj.weight": (d, ffn),
        }  # fmt: skip
    weights = {
        n: torch.randn(s, generator=g) * (0.3 if len(s) == 2 else 0.1) for n, s in shapes.items()
    }
    for name in weights:
        if name.endswith("norm.weight"):
            weights[name] += 1.0
    return weights


@pytest.fixture
def tiny_dir(tmp_path: Path) -> Path:
    weights = _tiny_weights()
    names = sorted(weights)
    shards = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, members in shards.items():
        save_file({n: weights[n].contiguous() for n in members}, str(tmp_path / file))
    index = {"weight_map": {n: f for f, members in shards.items() for n in members}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [5, 7]}))
    return tmp_path


def _naive_logits(w: dict[str, torch.Tensor], config: LlamaConfig, ids: list[int]) -> torch.Tensor:
    """A from-the-checkpoint HF Llama forward ([T, V]) straight from the raw tensor names."""

    def norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)

    def rope(x: torch.Tensor) -> torch.Tensor:  # [heads, T, D]
        angles = torch.outer(torch.arange(x.shape[1]).float(), rope_inv_freq(config))
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    x, t, hd = w["model.embed_tokens.weight"][ids], len(ids), config.head_dim
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).view(t, -1, hd).transpose(0, 1))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).view(t, -1, hd).transpose(0, 1))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(t, -1, hd).transpose(0, 1)
        k, v = k.repeat_interleave(2, 0), v.repeat_interleave(2, 0)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(t, -1)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def test_hf_directory_loads_and_matches_naive_forward(tiny_dir: Path) -> None:
    loaded = load_model(tiny_dir, dtype=torch.float32, device=torch.device("cpu"))
    c = loaded.config
    assert (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 4, 2, 16)
    assert c.eos_token_ids == (5, 7) and not c.tie_word_embeddings
    assert c.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 32)
    ids = [3, 17, 42, 8, 90, 1, 2, 64, 33, 12, 71, 5] * 3
    ours = dense_logits(loaded.model, dense_hidden(loaded.model, ids))
    torch.testing.assert_close(ours, _naive_logits(_tiny_weights(), c, ids), rtol=1e-4, atol=1e-4)


def test_hf_directory_engine_matches_reference(tiny_dir: Path) -> None:
    runner = ModelRunner.create(path=tiny_dir, num_blocks=64, block_size=4)
    assert runner.model_name == tiny_dir.name.lower()
    prompts = [[3, 17, 42], [8, 90, 1, 2, 64, 33, 12, 71, 5, 9, 10], [44] * 7]
    driver = Driver(runner, chunk=5)
    for i, prompt in enumerate(prompts):
        driver.add(str(i), prompt)
    outputs = driver.run(12)
    for i, prompt in enumerate(prompts):
        assert outputs[str(i)] == greedy_generate(runner._loaded, prompt, 12)


def test_hf_directory_with_unsupported_tensor_is_refused(tiny_dir: Path) -> None:
    save_file(
        {"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, str(tiny_dir / "x.safetensors")
    )
    index_file = tiny_dir / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    index["weight_map"]["model.layers.0.self_attn.q_proj.bias"] = "x.safetensors"
    index_file.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="q_proj.bias"):
        load_model(tiny_dir, dtype=torch.float32, device=torch.device("cpu"))


def test_low_precision_dtype_runs(tiny_dir: Path) -> None:
    runner = ModelRunner.create(path=tiny_dir, dtype="bfloat16", num_blocks=16, block_size=4)
    assert runner.dtype == "bfloat16"
    driver = Driver(runner)
    driver.add("x", [3, 17, 42, 8])
    assert all(0 <= t < 96 for t in driver.run(5)["x"])


def test_fingerprint_stable_and_weight_sensitive(tiny_dir: Path) -> None:
    first = load_model(tiny_dir, dtype=torch.float32, device=torch.device("cpu")).fingerprint
    again = load_model(tiny_dir, dtype=torch.float32, device=torch.device("cpu")).fingerprint
    assert first == again
    shard = tiny_dir / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    changed = load_model(tiny_dir, dtype=torch.float32, device=torch.device("cpu")).fingerprint
    assert changed != first


def test_llama3_rope_scaling_bands() -> None:
    base = dict(TINY_CONFIG)
    plain = rope_inv_freq(LlamaConfig(**base))
    scaled = rope_inv_freq(LlamaConfig(**base, rope_scaling=Llama3RopeScaling(8.0, 1.0, 4.0, 32)))
    assert scaled[0] == plain[0]  # the fastest rotation (short wavelength) is kept
    assert scaled[-1] == pytest.approx(plain[-1] / 8.0)  # the slowest is divided by factor
    assert torch.all(scaled <= plain)
