"""The flat decode loop (model/flat_layers.py) computes what the module tree computes, bit for
bit, on the served SmolLM2 (its 4-bit weights kept, float32, the CPU backend the worker picks),
and stands aside where it would not: a hooked layer, another model."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from services.worker.layers import cpu_attention_ext
from services.worker.layers.attention import TORCH, StepAttention
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.cpu_attention import CpuAttention
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.flat_layers import FlatLayers
from services.worker.model.loader import LoadedModel
from services.worker.model.quant import quantize_loaded
from tests.unit.worker.tiny_model import random_tiny

BLOCK = 16
CPU = torch.device("cpu")


@pytest.fixture
def served(smollm_gguf: LoadedModel) -> LoadedModel:
    """The session's SmolLM2 with its Q4_1 weights kept (conftest): the CPU default."""
    return smollm_gguf


def _steps(
    loaded: LoadedModel, backend, flat: FlatLayers | None, kv: torch.dtype = torch.float32
) -> list[torch.Tensor]:
    """Hidden states of a prefill of three prompts (lengths 5, 9, 20) and then three decode steps
    of all three, each a token chosen from the last hidden state; a fresh KV cache of `kv`."""
    model, config = loaded.model, loaded.config
    cache = PagedKVCache(config, 6, BLOCK, kv, CPU)
    tables = [[0, 1], [2, 3], [4, 5]]
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(config.vocab_size, (n,), generator=generator) for n in (5, 9, 20)]
    lens = [0, 0, 0]
    query = [len(t) for t in tokens]
    outputs = []
    for _ in range(4):
        context = [c + q for c, q in zip(lens, query, strict=True)]
        attn = StepAttention.build(query, context, [tables], BLOCK, CPU, backend)
        ids = torch.cat(tokens)
        with torch.no_grad():
            hidden = model(ids, attn.positions, attn, cache, flat=flat)
        outputs.append(hidden)
        last = attn.query_start[1:] - 1
        tokens = [hidden[row].abs().argmax().remainder(config.vocab_size).view(1) for row in last]
        lens, query = context, [1, 1, 1]
    return outputs


@pytest.mark.parametrize("kernels", ["auto", "torch"])
def test_the_flat_loop_gives_the_module_trees_bits(served: LoadedModel, kernels: str) -> None:
    # auto: the worker's (the C++ extension where built: the loop in C++); torch: torch ops
    # alone (the loop in Python)
    backend = choose_attention_backend("auto", CPU, served.config.head_dim)
    if kernels == "torch":
        backend = TORCH
    flat = served.model.flat_loop()
    assert flat is not None
    expected = _steps(served, backend, None)
    got = _steps(served, backend, flat)
    for step, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(e, g), f"step {step}: max diff {(e - g).abs().max()}"
    # With the extension, the CPU backend's steps ran the C++ loop (csrc/llama_layers.cpp)
    native = isinstance(backend, CpuAttention) and flat.native is not None
    assert native == (kernels == "auto" and cpu_attention_ext.load())
    assert (flat._caches is not None) == native


def test_the_cpp_loop_runs_over_an_int8_kv_cache_with_the_same_bits(served: LoadedModel) -> None:
    """--kv-cache-dtype int8: the C++ loop passes each layer's scales to the write and attention
    ops, and the steps (prefills, then decodes in int16 steps where built) equal the module
    tree's over the same cache."""
    if not cpu_attention_ext.load():
        pytest.skip("the C++ extension is not built")
    backend = choose_attention_backend("auto", CPU, served.config.head_dim)
    flat = served.model.flat_loop()
    assert flat is not None and flat.native is not None
    expected = _steps(served, backend, None, torch.int8)
    got = _steps(served, backend, flat, torch.int8)
    for step, (e, g) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(e, g), f"step {step}: max diff {(e - g).abs().max()}"
    assert flat._caches is not None and flat._caches[1] is not None  # the C++ loop ran
    assert not torch.equal(got[-1], _steps(served, backend, flat)[-1])  # int8, not float32


@pytest.mark.parametrize("kernel, activations", [("int16act", "int16"), ("int8act", "int8")])
def test_the_cpp_loop_runs_the_integer_activation_linears_with_the_same_bits(
    smollm: LoadedModel, kernel: str, activations: str
) -> None:
    """With int16act or int8act weights the C++ loop calls that kernel's op for every linear
    (llama_layers' activations argument), and the steps equal the module tree's."""
    if not cpu_attention_ext.load():
        pytest.skip("the C++ extension is not built")
    copied = dataclasses.replace(smollm, model=copy.deepcopy(smollm.model))
    loaded = quantize_loaded(copied, "gguf", kernel)
    backend = choose_attention_backend("auto", CPU, loaded.config.head_dim)
    flat = loaded.model.flat_loop()
    assert flat is not None and flat.native is not None
    assert flat.native.activations == activations
    expected = _steps(loaded, backend, None)
    for step, (e, g) in enumerate(zip(expected, _steps(loaded, backend, flat), strict=True)):
        assert torch.equal(e, g), f"step {step}: max diff {(e - g).abs().max()}"


def test_a_hooked_layer_or_another_model_is_not_flattened(served: LoadedModel) -> None:
    model = served.model
    handle = model.layers[3].mlp.register_forward_hook(lambda _m, _a, out: out * 2)
    try:
        assert model.flat_loop() is None  # tensor_parallel.py's all-reduce is such a hook
    finally:
        handle.remove()
    assert model.flat_loop() is not None
    assert FlatLayers.of(model.layers, torch.nn.Linear) is None  # not the layers it knows


def test_a_step_beyond_max_rows_takes_the_module_tree() -> None:
    """A prefill larger than a linear's direct call goes through the layers' own forward."""
    tiny = random_tiny(0)
    flat = tiny.model.flat_loop()
    assert flat is not None
    flat.max_rows = 0  # every step too large: run() must not be reached
    flat.run = None  # type: ignore[method-assign]
    cache = PagedKVCache(tiny.config, 4, BLOCK, torch.float32, tiny.model.embed_tokens.device)
    attn = StepAttention.build([3], [3], [[[0]]], BLOCK, cache._buffer.device, TORCH)
    ids = torch.tensor([1, 2, 3], device=cache._buffer.device)
    hidden = tiny.model(ids, attn.positions, attn, cache, flat=flat)
    assert hidden.shape == (3, tiny.config.hidden_size)


def test_the_worker_runs_its_llama_layers_flat_and_the_text_is_the_same(
    served: LoadedModel,
) -> None:
    from services.worker.engine.model_runner import ModelRunner
    from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan

    def greedy(flat: bool) -> list[int]:
        cache = PagedKVCache(served.config, 4, BLOCK, torch.float32, CPU)
        backend = choose_attention_backend("auto", CPU, served.config.head_dim)
        runner = ModelRunner(served, cache, max_model_len=64, model_name="m", backend=backend)
        assert runner._flat is not None
        if not flat:
            runner._flat = None
        prompt = list(range(100, 120))
        out = runner.execute(StepPlan(new=[NewSequence("r", prompt, 20, 0, 20, [[0, 1, 2]])]))
        tokens = [out[0].token_id]
        for _ in range(8):
            out = runner.execute(StepPlan(running=[RunningSequence("r", 1, [[]])]))
            tokens.append(out[0].token_id)
        return tokens

    assert greedy(flat=True) == greedy(flat=False)
