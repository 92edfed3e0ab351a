"""The engine over an int8 KV cache (--kv-cache-dtype int8): SmolLM2's greedy tokens equal those
over a float32 cache on these prompts, prefilled in chunks beside running decodes (on others a
near-tie can flip: 18 of benchmarks/default_choice.py's 24 prompts match for 32 tokens; "The
quick brown fox" parts ways at its 9th token here once a decode is computed in int16 steps,
and not beside other prompts); a
cache the backend cannot read, or an unknown --kv-cache-dtype, stops the start with a message
that says so."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from services.worker.config import WorkerConfig
from services.worker.engine.model_runner import ModelRunner
from services.worker.layers.attention_backends import torch_backend
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loaded import LoadedModel
from tests.unit.worker.plan_driver import Driver

NEW_TOKENS = 16
TEXTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The history of the Roman Empire",
    "Water boils at one hundred degrees Celsius at sea level, but at the top of a high mountain",
]


def _runner(smollm: LoadedModel, dtype: torch.dtype, backend=None) -> ModelRunner:
    cache = PagedKVCache(smollm.config, 64, 16, dtype, torch.device("cpu"))
    return ModelRunner(
        smollm, cache, max_model_len=1024, model_name="smollm2-test",
        backend=backend or torch_backend(),
    )  # fmt: skip


def _generate(runner: ModelRunner, prompts: list[list[int]]) -> dict[str, list[int]]:
    driver = Driver(runner, chunk=8)  # prompts in chunks, the first one's decodes beside them
    driver.add("r0", prompts[0])
    driver.step(NEW_TOKENS)
    for i, prompt in enumerate(prompts[1:], 1):
        driver.add(f"r{i}", prompt)
    return driver.run(NEW_TOKENS)


def test_int8_kv_generates_what_float32_kv_does(smollm: LoadedModel, tokenizer: Tokenizer) -> None:
    prompts = [tokenizer.encode(text).ids for text in TEXTS]
    int8 = _generate(_runner(smollm, torch.int8), prompts)
    float32 = _generate(_runner(smollm, torch.float32), prompts)
    assert int8 == float32
    assert "Paris" in tokenizer.decode(int8["r0"])  # an answer, not noise


def test_triton_refuses_an_int8_cache(smollm: LoadedModel) -> None:
    from services.worker.layers.triton_attention import TritonAttention

    with pytest.raises(ValueError, match="int8 runs on the torch kernels only"):
        _runner(smollm, torch.int8, TritonAttention())


def test_bad_kv_cache_dtype_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        WorkerConfig.from_args(["--kv-cache-dtype", "int4"])
    assert "--kv-cache-dtype" in capsys.readouterr().err
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, float32"):
        ModelRunner.create(kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="--kv-cache-dtype applies to one process"):
        WorkerConfig.from_args(["--kv-cache-dtype", "int8", "--tensor-parallel-size", "2"])
