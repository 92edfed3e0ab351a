"""A tiny random Llama in memory, head_dim 64 (the smallest the Triton kernels take), for tests
that run the kernels in Triton's interpreter."""

from __future__ import annotations

from pathlib import Path

import torch

from services.worker.model.config import LlamaConfig
from services.worker.model.llama import LlamaModel
from services.worker.model.loaded import LoadedModel

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CONFIG = LlamaConfig(
    vocab_size=256, hidden_size=128, intermediate_size=192, num_layers=2, num_heads=4,
    num_kv_heads=2, head_dim=64, rope_theta=10000.0, rms_norm_eps=1e-5,
    max_position_embeddings=512, tie_word_embeddings=False, eos_token_ids=(0,),
)  # fmt: skip


def random_tiny(seed: int) -> LoadedModel:
    """Weights ~N(0, 0.2), norms around 1: varied enough that greedy tokens differ by prompt."""
    model = LlamaModel(CONFIG, torch.float32, DEVICE)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            values = torch.randn(param.shape, generator=gen) * 0.2
            param.copy_(values + 1.0 if name.endswith("norm.weight") else values)
    return LoadedModel(config=CONFIG, model=model, fingerprint="tiny", path=Path("tiny"))


def random_prompts(lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, CONFIG.vocab_size, (n,), generator=gen).tolist() for n in lengths]
