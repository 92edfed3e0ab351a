"""The engine on the Triton kernels generates what it generates on torch ops and what the dense
reference does, greedy in fp32: attention, KV cache writes, mixed prefill/decode steps, chunked
prefill continuing a cached prefix. Without a GPU the kernels run in Triton's interpreter
(tests/conftest.py sets TRITON_INTERPRET), so the model is a tiny random Llama with head_dim
64, the smallest the kernels take."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.worker.engine.model_runner import ModelRunner
from services.worker.kernel_choice import resolve_kernels
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loaded import LoadedModel
from tests.reference_models import greedy_generate
from tests.unit.worker.plan_driver import Driver
from tests.unit.worker.tiny_model import CONFIG, DEVICE, random_prompts, random_tiny

NEW_TOKENS = 6
BLOCK_SIZE = 16
PROMPT_LENS = (5, 23, 40)  # one block, two blocks, three blocks (a partial last one each)


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return random_tiny(seed=7)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(PROMPT_LENS, seed=3)


def _runner(loaded: LoadedModel, kernels: str) -> ModelRunner:
    cache = PagedKVCache(CONFIG, 32, BLOCK_SIZE, torch.float32, DEVICE)
    device = loaded.model.embed_tokens.device
    backend = choose_attention_backend(kernels, device, loaded.config.head_dim)
    return ModelRunner(loaded, cache, max_model_len=512, model_name="tiny", backend=backend)


def _generate_together(runner: ModelRunner, prompts: list[list[int]]) -> list[list[int]]:
    """All prompts at once, prefills in 12-token chunks: steps mix chunks (continuing what
    earlier steps cached) with decodes, and end in decode-only steps."""
    driver = Driver(runner, chunk=12)
    for i, prompt in enumerate(prompts):
        driver.add(f"r{i}", prompt)
    outputs = driver.run(NEW_TOKENS)
    return [outputs[f"r{i}"] for i in range(len(prompts))]


def test_triton_matches_torch_and_reference(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    triton_runner = _runner(tiny, "triton")
    assert triton_runner.kernels == "triton"
    expected = [greedy_generate(tiny, prompt, NEW_TOKENS) for prompt in prompts]
    assert _generate_together(_runner(tiny, "torch"), prompts) == expected
    assert _generate_together(triton_runner, prompts) == expected


def test_triton_prefix_reuse_continues_cached_blocks(
    tiny: LoadedModel, prompts: list[list[int]]
) -> None:
    """A second request starts from the first's two cached blocks and prefills the rest in
    chunks over them, beside the first's decodes."""
    driver = Driver(_runner(tiny, "triton"), chunk=8)
    driver.add("first", prompts[2])
    for _ in range(5):  # the 40-token prompt's chunks, then one decode
        driver.step(NEW_TOKENS)
    shared = driver.seqs["first"].tables[0][:2]
    follower = prompts[2][:32] + prompts[1][:9]
    driver.add("second", follower, cached_tables=[shared], num_cached=32)
    outputs = driver.run(NEW_TOKENS)
    assert outputs["second"] == greedy_generate(tiny, follower, NEW_TOKENS)
    assert outputs["first"] == greedy_generate(tiny, prompts[2], NEW_TOKENS)


def test_describe_reports_kernels(tiny: LoadedModel) -> None:
    # Imported here: the GPU check runs this file where the server's packages are absent.
    from services.worker.serving.server import WorkerServicer

    info = asyncio.run(WorkerServicer(_runner(tiny, "triton"), "tiny").Describe(None, None))
    assert info.kernels == "triton"
    info = asyncio.run(WorkerServicer(_runner(tiny, "auto"), "tiny").Describe(None, None))
    assert info.kernels == ("triton" if DEVICE.type == "cuda" else "torch")


def test_auto_picks_torch_on_cpu_and_triton_on_cuda() -> None:
    assert resolve_kernels("auto", torch.device("cpu"), 64) == "torch"
    assert resolve_kernels("auto", torch.device("cuda:0"), 64) == "triton"
    assert resolve_kernels("auto", torch.device("cuda:0"), 16) == "torch", "no tiles for 16"
    assert resolve_kernels("torch", torch.device("cuda:0"), 64) == "torch"


def test_forcing_triton_where_it_cannot_run_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="head_dim"):
        resolve_kernels("triton", torch.device("cuda:0"), 16)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_kernels("triton", torch.device("cpu"), 64)
    with pytest.raises(ValueError, match="--kernels must be"):
        resolve_kernels("fast", torch.device("cpu"), 64)
