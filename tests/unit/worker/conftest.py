"""Shared, session-scoped fixtures: the default model is loaded (dequantized) once; and every
test here runs its torch ops on one thread unless it asks for more.

The loaders are imported inside the fixtures: the GPU check runs tests in this directory
where gguf (which they import) is not installed."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import pytest
import torch

from services.worker.engine.model_runner import ModelRunner
from services.worker.layers.attention_backends import torch_backend
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loaded import LoadedModel
from tests.reference_models import default_model

if TYPE_CHECKING:
    from tokenizers import Tokenizer


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The in-process engine and reference runs on one torch thread, as greedy_generate's
    reference already does: on two cores shared with anything else (a CI run's idle stacks,
    other processes), a second OpenMP thread waits for a core at every op's barrier. Measured
    on a busy 2-core box: test_preemption_engine's two engine runs took 51 s of CPU on two
    threads, 4.5 s on one. The kernel tests that check several threads set them themselves;
    the stacks' workers (tests/e2e, tests/reliability) serve with the worker's own thread count."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm() -> LoadedModel:
    return default_model()  # the e2e references' too: one load a session


@pytest.fixture(scope="session")
def smollm_gguf(smollm: LoadedModel) -> LoadedModel:
    """The session's float32 SmolLM2, copied, under --quantization gguf (its Q4_1 weights and
    Q8_0 table kept as the file stores them): built once for test_quant_gguf.py and
    test_q8_0_weight.py (6-8 s each on a 2-core box). A test that changes it puts it back."""
    from services.worker.model.quant import quantize_loaded

    return quantize_loaded(dataclasses.replace(smollm, model=copy.deepcopy(smollm.model)), "gguf")


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    from services.tokenizer.loader import load_tokenizer
    from services.worker.model.loader import default_path

    return load_tokenizer(default_path()).tokenizer


RunnerFactory = Callable[..., ModelRunner]


@pytest.fixture(scope="session")
def make_runner(smollm: LoadedModel) -> RunnerFactory:
    """ModelRunners sharing the loaded weights, each with a fresh cache (small by default)."""

    def make(num_blocks: int = 256, block_size: int = 16, max_model_len: int = 4096) -> ModelRunner:
        cache = PagedKVCache(
            smollm.config, num_blocks, block_size, torch.float32, torch.device("cpu")
        )
        return ModelRunner(
            smollm,
            cache,
            max_model_len=max_model_len,
            model_name="smollm2-test",
            backend=torch_backend(),
        )

    return make


@pytest.fixture(scope="session")
def cpu_extension() -> None:
    """The C++ CPU extension loaded: `make install` builds it; a bare checkout builds it here
    once (cached in build/). The extension's own tests use it (pytestmark)."""
    from services.worker.layers import cpu_attention_ext

    if not cpu_attention_ext.load():
        cpu_attention_ext.build()
        cpu_attention_ext.load.cache_clear()
        assert cpu_attention_ext.load()
