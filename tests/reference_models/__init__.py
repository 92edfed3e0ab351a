"""Dense, unpaged reference forward passes of the worker's models (batch of one, float32), for
tests only: they share the loaded weights with the engine but none of its attention, cache or
RoPE code, so a test comparing the two checks paging, batching and chunking rather than the
engine agreeing with itself. Slow by design.

llama_reference.py and gemma3_reference.py each give dense_hidden and dense_logits over a
DenseKV (dense_kv.py); greedy_generate below drives whichever fits the model."""

from __future__ import annotations

import functools

import torch

from services.worker.model.llama import LlamaModel
from services.worker.model.loaded import LoadedModel
from tests.reference_models import gemma3_reference, llama_reference
from tests.reference_models.dense_kv import DenseKV


@functools.cache
def default_model() -> LoadedModel:
    """The default model in float32 on the CPU, loaded once a session (12 s on a busy 2-core
    machine): tests/unit/worker's `smollm` and the e2e references share it (a test that changes
    it puts it back)."""
    # Imported here: the GPU check collects this package's users on machines without `gguf`.
    from services.worker.model.loader import default_path, load_model

    return load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))


def default_model_greedy(prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """greedy_generate of each prompt on the default model, dense in float32."""
    from services.tokenizer.loader import load_tokenizer

    tokenizer = load_tokenizer(None)
    return [greedy_generate(default_model(), tokenizer.encode(p), max_new_tokens) for p in prompts]


def greedy_generate(
    loaded_model: LoadedModel, prompt_ids: list[int], max_new_tokens: int
) -> list[int]:
    """Greedy continuation of prompt_ids: the max_new_tokens argmax tokens (no EOS stop).

    On one torch thread: tests run it in the pytest process on two cores shared with other
    processes (a stack's four, on a busy machine others' too), where a second OpenMP thread
    waits for a core at every op's barrier. Load average ~12: a decode token of SmolLM2 took
    6-15 s on two threads, 0.2 s on one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _greedy(loaded_model, prompt_ids, max_new_tokens)
    finally:
        torch.set_num_threads(threads)


def _greedy(loaded_model: LoadedModel, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    model = loaded_model.model
    reference = llama_reference if isinstance(model, LlamaModel) else gemma3_reference
    kv = DenseKV(model.config.num_layers)
    hidden = reference.dense_hidden(model, list(prompt_ids), kv)[-1:]  # the whole prompt
    generated: list[int] = []
    for _ in range(max_new_tokens):
        # Only the last position's logits: a [T, V] head would dominate the cost otherwise.
        generated.append(int(reference.dense_logits(model, hidden)[0].argmax()))
        if len(generated) < max_new_tokens:
            hidden = reference.dense_hidden(model, [generated[-1]], kv)
    return generated
