"""Decode steps through DecodeGraphs generate what eager steps generate, greedy in fp32.

On a GPU the graphs are captured and replayed. Without one, the Triton kernels run in the
interpreter and DecodeGraphs runs the same static buffers and padding eagerly, so these tests
still check what the graphs add: inputs copied into fixed buffers, batches padded to a captured
size with rows that write no K/V, block tables wider than any sequence. The CUDA-only test
reports as skipped here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from services.worker.engine.decode_graphs import capture_sizes
from services.worker.engine.model_runner import ModelRunner
from services.worker.kernels import decode_attention
from services.worker.layers.attention_backends import attention_backend
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loaded import LoadedModel
from tests.reference_models import greedy_generate
from tests.unit.worker.plan_driver import Driver
from tests.unit.worker.tiny_model import CONFIG, DEVICE, random_prompts, random_tiny

NEW_TOKENS = 6
BLOCK_SIZE = 16
PROMPT_LENS = (5, 23, 40)
# Graphs size the decode kernel for max_model_len; small keeps the interpreter quick.
MAX_MODEL_LEN = 64
# Long enough that the decode kernel splits each context: 2 splits of 256 tokens in a graph on
# a GPU, one per 32 tokens eagerly on the CPU (choose_num_splits).
LONG_MODEL_LEN = 512
LONG_PROMPT = 300 if DEVICE.type == "cuda" else 100  # > 256 on a GPU, > 32 on the CPU


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return random_tiny(seed=11)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    return random_prompts(PROMPT_LENS, seed=5)


def _runner(loaded: LoadedModel, max_batch: int, max_model_len: int = MAX_MODEL_LEN) -> ModelRunner:
    cache = PagedKVCache(CONFIG, 32, BLOCK_SIZE, torch.float32, DEVICE)
    runner = ModelRunner(
        loaded, cache, max_model_len=max_model_len, model_name="tiny",
        backend=attention_backend("triton"), cuda_graph_max_batch=max_batch,
    )  # fmt: skip
    runner.capture_decode_graphs()
    return runner


def _generate(
    runner: ModelRunner, prompts: list[list[int]], tag: str = "r", chunk: int = 16
) -> list[list[int]]:
    """Prefills in chunks: early steps mix chunks with decodes, which run eagerly."""
    driver = Driver(runner, chunk=chunk)
    for i, prompt in enumerate(prompts):
        driver.add(f"{tag}{i}", prompt)
    outputs = driver.run(NEW_TOKENS)
    return [outputs[f"{tag}{i}"] for i in range(len(prompts))]


def test_capture_sizes_cover_every_batch_up_to_the_maximum() -> None:
    assert capture_sizes(1) == [1]
    assert capture_sizes(12) == [1, 2, 4, 8, 12]
    assert capture_sizes(64)[-3:] == [32, 48, 64]
    with pytest.raises(ValueError, match=">= 1"):
        capture_sizes(0)


@pytest.fixture(scope="module")
def expected(tiny: LoadedModel, prompts: list[list[int]]) -> list[list[int]]:
    return [greedy_generate(tiny, prompt, NEW_TOKENS) for prompt in prompts]


def test_graph_decode_matches_reference(
    tiny: LoadedModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    """Three sequences decode in the graph of four, then one alone in the graph of one."""
    runner = _runner(tiny, 4)
    assert _generate(runner, prompts) == expected
    assert runner._graphs is not None
    assert runner._graphs.steps_run == NEW_TOKENS - 1, "decode steps did not use the graphs"
    assert _generate(runner, prompts[:1], tag="single") == expected[:1]
    assert runner._graphs.steps_run == 2 * (NEW_TOKENS - 1)


def test_graph_decode_across_splits(tiny: LoadedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """A context longer than one split: the decode kernel the graphs run writes a partial per
    split and the reduction merges them; the shorter sequence leaves its later splits empty."""
    splits: list[int] = []
    launch = decode_attention._launch

    def recording(*args: object) -> None:
        splits.append(args[-2])  # num_splits
        launch(*args)

    monkeypatch.setattr(decode_attention, "_launch", recording)
    prompts = random_prompts((LONG_PROMPT, 40), seed=9)
    expected = [greedy_generate(tiny, prompt, NEW_TOKENS) for prompt in prompts]
    runner = _runner(tiny, 2, max_model_len=LONG_MODEL_LEN)
    assert _generate(runner, prompts, chunk=LONG_PROMPT) == expected
    assert runner._graphs is not None and runner._graphs.steps_run == NEW_TOKENS - 1
    assert max(splits) > 1, f"the decode kernel never split: {splits}"


def test_batches_larger_than_the_graphs_run_eagerly(
    tiny: LoadedModel, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    runner = _runner(tiny, 2)
    # Whole prompts in the first step: every later step decodes all three together.
    assert _generate(runner, prompts, chunk=64) == expected
    assert runner._graphs is not None and runner._graphs.steps_run == 0


def test_padding_rows_write_no_kv(tiny: LoadedModel, prompts: list[list[int]]) -> None:
    """Three sequences in the graph of four: the decode step writes exactly their three new
    slots; the padding row writes nothing (block 0 included)."""
    runner = _runner(tiny, 8)
    driver = Driver(runner, chunk=64)
    for i, prompt in enumerate(prompts):
        driver.add(f"r{i}", prompt)
    driver.step(NEW_TOKENS)  # the three prefills
    before = runner._cache._buffer.clone()  # [L, 2, blocks, block_size, Hkv, D]
    driver.step(NEW_TOKENS)  # one decode step of three sequences, padded to four
    assert runner._graphs is not None and runner._graphs.steps_run == 1
    changed = (before != runner._cache._buffer).flatten(-2).any(-1).any(0).any(0)
    written = {(int(b), int(o)) for b, o in changed.nonzero().tolist()}
    expected = set()
    for i, prompt in enumerate(prompts):
        (blocks,), pos = driver.seqs[f"r{i}"].tables, len(prompt)
        expected.add((blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE))
    assert written == expected


@pytest.mark.skipif(DEVICE.type != "cuda", reason="CUDA graphs need a GPU")
def test_graphs_are_captured_on_cuda(tiny: LoadedModel) -> None:
    runner = _runner(tiny, 8)
    assert runner.cuda_graph_sizes == [1, 2, 4, 8]


def test_a_worker_that_cannot_run_its_kernels_says_why_in_one_line() -> None:
    """--kernels triton on a CPU without the interpreter: exit 1 with the reason, no traceback."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "services.worker", "--kernels", "triton", "--device", "cpu",
         "--port", "0"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert "worker: cannot start: --kernels triton on the CPU needs TRITON_INTERPRET=1" in (
        done.stderr
    )
    assert "Traceback" not in done.stderr
