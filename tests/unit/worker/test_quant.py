"""Weight-only int8: the per-channel error bound, int8 linears against float ones, and the
quantized SmolLM2 served by the engine (memory, greedy agreement with float32)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from torch import nn

from services.worker.config import QUANTIZATION_CHOICES, WorkerConfig
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import StepPlan
from services.worker.layers.attention_backends import torch_backend
from services.worker.layers.int8_weight import (
    INT8_KERNELS,
    INT8PACK_MAX_ROWS,
    ByRows,
    Int8Weight,
    int8_kernel,
    int8_linear,
    quantize_int8,
)
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loader import LoadedModel
from services.worker.model.quant import (
    QUANTIZATION_METHODS,
    quantize_loaded,
    quantize_model,
    weight_bytes,
)
from tests.unit.worker.plan_driver import Driver

NEW_TOKENS = 16
PROMPTS = [
    "The capital of France is",
    "def add(a, b):\n    return",
    "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at one hundred degrees Celsius at sea level, but on a mountain",
    "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n",
    "Once upon a time, in a small village by the sea, there lived",
]
# A quality check, not an identity: int8 weights move logits a little, and greedy decoding
# follows the float model until a near-tie flips. Measured on SmolLM2-135M-Instruct (float32
# and int8 on the CPU): 83% of tokens before the first divergence, 4 of 6 prompts identical.
MIN_PREFIX_AGREEMENT = 0.6  # mean share of tokens equal to float32 before the first divergence
MIN_EXACT_PROMPTS = 3  # of 6


def _rows_of_many_scales() -> torch.Tensor:
    torch.manual_seed(0)
    weight = torch.randn(64, 96) * torch.logspace(-4, 2, 64)[:, None]  # [out, in]
    weight[5] = 0.0  # an all-zero channel
    return weight


def test_quantize_int8_error_is_within_half_a_step_per_channel() -> None:
    weight = _rows_of_many_scales()
    q, scale = quantize_int8(weight, torch.float32)
    assert q.dtype == torch.int8 and scale.shape == (64,)
    assert int(q.abs().max()) == 127  # symmetric: the row's absmax maps to +-127
    error = (weight - q.float() * scale[:, None]).abs()  # [out, in]
    assert torch.all(error <= scale[:, None] / 2 * (1 + 1e-6))
    assert torch.equal(q.abs().amax(dim=1)[torch.arange(64) != 5], torch.full((63,), 127))
    assert torch.all(q[5] == 0)


@pytest.mark.parametrize("kernel", list(INT8_KERNELS))
def test_int8_linear_matches_float_within_the_scale_bound(kernel: str) -> None:
    """An nn.Linear model (not our Llama): F.linear through an Int8Weight is off from the
    float linear by at most sum_k |x_k| * scale_n / 2 per output n."""
    weight = _rows_of_many_scales()
    linear = nn.Linear(96, 64)
    linear.weight.data.copy_(weight)
    model = nn.Sequential(linear, nn.ReLU())
    x = torch.randn(2, 3, 96)  # [..., in]: leading dims are kept
    expected = F.linear(x, weight, linear.bias)
    assert quantize_model(model, "int8", kernel) == 1
    assert isinstance(linear.weight, Int8Weight)
    got = F.linear(x, linear.weight, linear.bias)  # what linear(x) runs
    bound = x.abs().sum(-1, keepdim=True) * linear.weight.scale / 2  # [..., out]
    assert got.shape == expected.shape
    assert torch.all((got - expected).abs() <= bound * (1 + 1e-4) + 1e-5)
    dequantized = F.linear(x, linear.weight.float(), linear.bias)  # other ops see floats
    atol = 1e-6 * float(got.detach().abs().max())
    torch.testing.assert_close(got, dequantized, rtol=1e-5, atol=atol)
    torch.testing.assert_close(model(x), torch.relu(got))


def _auto_pick(device: torch.device, dtype: torch.dtype, rows: int) -> str:
    """The kernel "auto" (chosen once per weight) runs for a call of `rows` activation rows."""
    kernel = int8_kernel("auto", device, dtype)
    if isinstance(kernel, ByRows):
        kernel = kernel.small if rows <= kernel.max_rows else kernel.large
    return kernel.name


def test_auto_kernel_is_int8pack_only_for_small_half_precision_batches_on_the_cpu() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for dtype in (torch.bfloat16, torch.float16):
        assert _auto_pick(cpu, dtype, 1) == "int8pack"
        assert _auto_pick(cpu, dtype, INT8PACK_MAX_ROWS) == "int8pack"
        assert _auto_pick(cpu, dtype, INT8PACK_MAX_ROWS + 1) == "dequant"
        assert _auto_pick(cuda, dtype, 1) == "dequant"
    assert _auto_pick(cpu, torch.float32, 1) == "dequant"  # int8pack: 2-20x slower there


def test_auto_weight_computes_each_call_with_the_kernel_its_rows_pick() -> None:
    linear = nn.Linear(96, 64, bias=False).to(torch.bfloat16)
    assert quantize_model(linear, "int8") == 1  # kernel "auto" by default
    weight = linear.weight
    assert isinstance(weight, Int8Weight) and weight.kernel.name == "auto"
    for rows in (1, INT8PACK_MAX_ROWS, INT8PACK_MAX_ROWS + 1):
        x = torch.randn(rows, 96).to(torch.bfloat16)
        chosen = INT8_KERNELS[_auto_pick(x.device, x.dtype, rows)]
        want = int8_linear(x, weight.qweight, weight.scale, kernel=chosen)
        assert torch.equal(linear(x), want), rows


def test_tied_embedding_quantized_once_serves_both_lookups_and_logits() -> None:
    """Only when asked: the rows F.embedding reads carry the same per-row scales."""
    torch.manual_seed(0)
    embedding = nn.Embedding(50, 32)
    head = nn.Linear(32, 50, bias=False)
    head.weight = embedding.weight  # tied, as SmolLM2's output head
    model = nn.ModuleDict({"embed": embedding, "head": head})
    table = embedding.weight.detach().clone()
    assert quantize_model(copy.deepcopy(model), "int8") == 0  # kept by default
    assert quantize_model(model, "int8", embeddings=True) == 1
    assert embedding.weight is head.weight and isinstance(head.weight, Int8Weight)
    ids = torch.tensor([[3, 7], [49, 0]])
    rows = embedding(ids)  # [2, 2, 32]
    assert torch.all((rows - table[ids]).abs() <= head.weight.scale[ids, None] / 2 * 1.0001)
    torch.testing.assert_close(head(rows), F.linear(rows, embedding.weight.float()))


def test_unknown_methods_and_kernels_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown quantization method 'int3'"):
        quantize_model(nn.Linear(4, 4), "int3")
    with pytest.raises(ValueError, match="unknown int8 kernel"):
        quantize_model(nn.Linear(4, 4), "int8", kernel="fast")
    assert quantize_model(nn.Linear(4, 4), "none") == 0
    assert set(QUANTIZATION_CHOICES) == {"auto", *QUANTIZATION_METHODS}  # what quant.py does


def test_worker_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerConfig.from_args([]).quantization == "auto"  # quant_choice.py resolves it
    assert WorkerConfig.from_args(["--null"]).quantization == "auto"  # none, as nothing loads
    assert WorkerConfig.from_args(["--quantization", "int8"]).quantization == "int8"
    monkeypatch.setenv("LAYERSERVE_WORKER_QUANTIZATION", "int8")
    assert WorkerConfig.from_args([]).quantization == "int8"
    monkeypatch.setenv("LAYERSERVE_WORKER_QUANTIZATION", "fp4")
    with pytest.raises(ValueError, match="LAYERSERVE_WORKER_QUANTIZATION=fp4: must be one of"):
        WorkerConfig.from_args([])
    monkeypatch.delenv("LAYERSERVE_WORKER_QUANTIZATION")
    with pytest.raises(ValueError, match="not with --null"):
        WorkerConfig.from_args(["--quantization", "int8", "--null"])


@pytest.fixture(scope="module")
def smollm_int8(smollm: LoadedModel) -> LoadedModel:
    """The session's float32 SmolLM2, copied and quantized (the original stays float)."""
    return quantize_loaded(dataclasses.replace(smollm, model=copy.deepcopy(smollm.model)), "int8")


def test_quantized_smollm_holds_int8_linears_and_float_embeddings(
    smollm: LoadedModel, smollm_int8: LoadedModel
) -> None:
    model = smollm_int8.model
    layers = smollm.config.num_layers
    linears = [b for b in model.buffers() if isinstance(b, Int8Weight)]
    assert len(linears) == 4 * layers  # qkv, o, gate_up, down in every layer
    # Each stands for a float32 weight (its dtype) and holds one byte per value.
    assert all(w.dtype == torch.float32 and w.element_size() == 1 for w in linears)
    floats = dict(model.named_parameters())
    assert floats["embed_tokens"].dtype == torch.float32  # embeddings and the tied head
    assert not any("proj" in name for name in floats)  # the float originals are gone
    assert smollm_int8.fingerprint != smollm.fingerprint
    float_linear_bytes = sum(w.numel() * 4 for w in linears)
    int8_linear_bytes = sum(w.qweight.numel() + w.scale.numel() * 4 for w in linears)
    assert 0.25 <= int8_linear_bytes / float_linear_bytes < 0.26
    saved = weight_bytes(smollm.model) - weight_bytes(model)
    assert saved == float_linear_bytes - int8_linear_bytes


def _greedy(loaded: LoadedModel, prompts: list[list[int]]) -> list[list[int]]:
    cache = PagedKVCache(loaded.config, 64, 16, torch.float32, torch.device("cpu"))
    runner = ModelRunner(
        loaded, cache, max_model_len=1024, model_name="smollm2-int8-test", backend=torch_backend()
    )
    driver = Driver(runner)
    for i, prompt in enumerate(prompts):
        driver.add(f"p{i}", prompt)
    out = driver.run(NEW_TOKENS)
    runner.execute(StepPlan(finished_ids=list(out)))
    return [out[f"p{i}"] for i in range(len(prompts))]


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_quantized_greedy_output_mostly_agrees_with_float32(
    smollm: LoadedModel, smollm_int8: LoadedModel, tokenizer: Tokenizer
) -> None:
    prompts = [tokenizer.encode(text).ids for text in PROMPTS]
    expected = _greedy(smollm, prompts)
    got = _greedy(smollm_int8, prompts)
    prefixes = [_prefix(e, g) for e, g in zip(expected, got, strict=True)]
    agreement = sum(prefixes) / (NEW_TOKENS * len(prompts))
    assert agreement >= MIN_PREFIX_AGREEMENT, prefixes
    assert sum(p == NEW_TOKENS for p in prefixes) >= MIN_EXACT_PROMPTS, prefixes
