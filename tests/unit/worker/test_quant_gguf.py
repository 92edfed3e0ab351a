"""The packaged SmolLM2 (a Q4_1 GGUF) with its 4-bit weights kept as the file stores them
(--quantization gguf): the same weights as the float load, in a quarter of the bytes, and the
same greedy text."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from tokenizers import Tokenizer

from services.worker.layers.int4_weight import Int4Weight
from services.worker.model.loader import LoadedModel
from services.worker.model.quant import quantize_loaded, weight_bytes
from tests.unit.worker.test_quant import NEW_TOKENS, PROMPTS, _greedy, _prefix

# float32 activations on the file's own values: only the matmuls' summation order differs
# from the float load, so greedy text departs only at a near-tie.
MIN_PREFIX_AGREEMENT = 0.9


def test_q4_1_linears_are_kept_4_bit_and_stand_for_the_files_weights(
    smollm: LoadedModel, smollm_gguf: LoadedModel
) -> None:
    floats = dict(smollm.model.named_parameters())
    kept = {n: b for n, b in smollm_gguf.model.named_buffers() if isinstance(b, Int4Weight)}
    assert len(kept) == 4 * smollm.config.num_layers  # qkv, o, gate_up, down in every layer
    for name, weight in kept.items():  # fused, q/k rows un-permuted, exactly the file's values
        assert torch.equal(weight.dequantized(), floats[name]), name
    # Q8_0 in the file: a float parameter, or a Q8_0Weight standing for float32 values
    assert smollm_gguf.model.embed_tokens.dtype == torch.float32
    assert smollm_gguf.fingerprint != smollm.fingerprint
    linear_float_bytes = sum(floats[n].numel() * 4 for n in kept)
    saved = weight_bytes(smollm.model) - weight_bytes(smollm_gguf.model)
    assert saved >= 0.6 * linear_float_bytes  # int4 tiles + nibbles + scales: ~1/3 of float32


def test_kept_4_bit_greedy_text_follows_the_float_load(
    smollm: LoadedModel, smollm_gguf: LoadedModel, tokenizer: Tokenizer
) -> None:
    prompts = [tokenizer.encode(text).ids for text in PROMPTS[:3]]  # seconds, not a minute
    expected = _greedy(smollm, prompts)
    got = _greedy(smollm_gguf, prompts)
    prefixes = [_prefix(e, g) for e, g in zip(expected, got, strict=True)]
    assert sum(prefixes) / (NEW_TOKENS * len(prompts)) >= MIN_PREFIX_AGREEMENT, prefixes


def test_auto_keeps_the_files_4_bit_weights_under_float32_compute_and_says_why(
    smollm: LoadedModel, caplog: pytest.LogCaptureFixture
) -> None:
    copied = dataclasses.replace(smollm, model=copy.deepcopy(smollm.model))
    with caplog.at_level("INFO", logger="services.worker.model.quant"):
        kept = quantize_loaded(copied, "auto")
    assert "quantization gguf (auto: the file's Q4_0/Q4_1 weights kept 4-bit" in caplog.text
    assert any(isinstance(b, Int4Weight) for b in kept.model.buffers())
    assert kept.fingerprint != smollm.fingerprint


def test_activations_choose_what_the_4_bit_weights_multiply(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--activations int8 serves the file's 4-bit weights through int8 activations (linears
    and the Q8_0 head alike), says so at load, and a name it does not know stops the start
    before the model loads."""
    from services.worker.config import WorkerConfig
    from services.worker.engine.model_runner import ModelRunner
    from services.worker.layers.q8_0_weight import Q8_0Weight

    assert WorkerConfig.from_args(["--activations", "int8"]).activations == "int8"
    monkeypatch.setenv("LAYERSERVE_WORKER_ACTIVATIONS", "float32")
    assert WorkerConfig.from_args([]).activations == "float32"
    with caplog.at_level("INFO", logger="services.worker.model.quant"):
        runner = ModelRunner.create(num_blocks=8, quantization="gguf", activations="int8")
    buffers = list(runner._model.buffers())
    assert {b.kernel.name for b in buffers if isinstance(b, Int4Weight)} == {"int8act"}
    assert all(b.packed is not None for b in buffers if isinstance(b, Q8_0Weight))
    assert "4-bit linears through int8act" in caplog.text
    with pytest.raises(ValueError, match="--activations must be one of auto, float32"):
        ModelRunner.create(activations="fp8")
