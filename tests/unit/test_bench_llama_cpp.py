"""The llama.cpp baseline: its llama-server-like continuous batching checked step by step
against a recording fake of llama.cpp's batch API (runs everywhere), and the real
llama-cpp-python on the packaged GGUF where the `llama-cpp` extra is installed."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from benchmarks.hf_baseline import _sampling_kwargs
from benchmarks.llama_cpp_baseline import LlamaCppBudget, LlamaCppEngine
from benchmarks.sampling import GREEDY, SAMPLED
from benchmarks.workload import VOCAB


class FakeLlama:
    """Records every llama_decode() batch as (token, pos, seq_id, logits) rows; "samples"
    1000 + seq_id * 100 + the number of tokens that sequence has sampled so far."""

    def __init__(self) -> None:
        self.steps: list[list[tuple[int, int, int, bool]]] = []
        self.sampled: dict[int, int] = {}
        self.removed: list[int] = []

    def llama_memory_clear(self, memory, data) -> None: ...

    def llama_decode(self, ctx, b) -> int:
        self.steps.append(
            [(b.token[i], b.pos[i], b.seq_id[i][0], b.logits[i]) for i in range(b.n_tokens)]
        )
        return 0

    def llama_sampler_sample(self, sampler, ctx, row: int) -> int:
        token, pos, seq, logits = self.steps[-1][row]
        assert logits, "sampled a row whose logits were not asked for"
        n = self.sampled.get(seq, 0)
        self.sampled[seq] = n + 1
        return 1000 + 100 * seq + n

    def llama_memory_seq_rm(self, memory, seq_id: int, p0: int, p1: int) -> bool:
        self.removed.append(seq_id)
        self.sampled.pop(seq_id)
        return True

    def llama_sampler_free(self, sampler) -> None: ...


def fake_engine(n_batch: int, n_seq_max: int) -> tuple[LlamaCppEngine, FakeLlama]:
    fake = FakeLlama()
    engine = object.__new__(LlamaCppEngine)
    engine._ll, engine._ctx, engine._memory = fake, None, None
    engine.budget = LlamaCppBudget(n_ctx=1024, n_batch=n_batch, n_seq_max=n_seq_max, n_threads=1)
    rows = range(n_batch)
    engine._batch = SimpleNamespace(
        n_tokens=0, token=[0 for _ in rows], pos=[0 for _ in rows], n_seq_id=[0 for _ in rows],
        seq_id=[[0] for _ in rows], logits=[False for _ in rows],
    )  # fmt: skip
    engine._sampler = lambda sampling, seed: seed
    return engine, fake


def test_decode_tokens_go_first_then_prompt_chunks_within_the_batch_budget() -> None:
    engine, fake = fake_engine(n_batch=8, n_seq_max=2)
    prompts = [list(range(10, 20)), [30, 31, 32], [40, 41, 42, 43, 44]]
    out = engine.generate(prompts, [2, 3, 1], GREEDY, seeds=[0, 1, 2])
    # Request 0 (seq 1) prefills in chunks of the 8-token budget, its last prompt row asks for
    # logits; request 1 (seq 0) is admitted at once and fills what the budget leaves.
    assert fake.steps[0] == [(10 + k, k, 1, False) for k in range(8)]
    assert fake.steps[1] == [(18, 8, 1, False), (19, 9, 1, True)] + [
        (30, 0, 0, False), (31, 1, 0, False), (32, 2, 0, True)
    ]  # fmt: skip
    # Next: each running sequence's last token at its next position, before any prompt.
    assert fake.steps[2] == [(1100, 10, 1, True), (1000, 3, 0, True)]
    # Request 0 is done (2 tokens): its sequence is freed and request 2 takes it.
    assert fake.steps[3][0] == (1001, 4, 0, True)
    assert fake.steps[3][1:] == [(40 + k, k, 1, k == 4) for k in range(5)]
    assert len(fake.steps) == 4 and fake.removed == [1, 0, 1]  # every sequence freed when done
    assert out == [[1100, 1101], [1000, 1001, 1002], [1100]]


def test_every_request_gets_exactly_its_output_length() -> None:
    engine, _ = fake_engine(n_batch=16, n_seq_max=3)
    rng = random.Random(0)
    prompts = [[rng.randint(*VOCAB) for _ in range(rng.randint(1, 40))] for _ in range(9)]
    lens = [rng.randint(1, 6) for _ in prompts]
    out = engine.generate(prompts, lens, SAMPLED, seeds=list(range(9)))
    assert [len(tokens) for tokens in out] == lens


def test_transformers_samples_with_the_same_settings() -> None:
    assert _sampling_kwargs(GREEDY) == {"do_sample": False}
    # top_k 0: transformers' generate() otherwise applies its default top_k of 50.
    assert _sampling_kwargs(SAMPLED) == {
        "do_sample": True, "temperature": 0.7, "top_p": 0.95, "top_k": 0
    }  # fmt: skip


def test_real_llama_cpp_on_the_packaged_gguf() -> None:
    pytest.importorskip("llama_cpp", reason="the llama-cpp extra builds llama.cpp from source")
    from services.worker.model.loader import default_path

    budget = LlamaCppBudget(n_ctx=512, n_batch=32, n_seq_max=2, n_threads=1)
    engine = LlamaCppEngine(default_path(), budget)
    try:
        assert "Q4_1" in engine.describe()
        rng = random.Random(1)
        prompts = [[rng.randint(*VOCAB) for _ in range(n)] for n in (40, 9, 50)]
        lens = [3, 5, 2]
        first = engine.generate(prompts, lens, SAMPLED, seeds=[11, 12, 13])
        assert [len(t) for t in first] == lens
        assert all(0 <= t < 49152 for tokens in first for t in tokens)
        assert engine.generate(prompts, lens, SAMPLED, seeds=[11, 12, 13]) == first  # seeded
        greedy = engine.generate(prompts, lens, GREEDY, seeds=[0, 0, 0])
        assert engine.generate(prompts, lens, GREEDY, seeds=[5, 6, 7]) == greedy
    finally:
        engine.close()


def test_real_llama_cpp_greedy_continues_a_repeated_pattern() -> None:
    """Chunked prefill (n_batch 16) and a queue (2 sequences for 3 requests): positions,
    sequences and batching must all be right for 12 greedy tokens to carry on each prompt's
    pattern (transformers' generate() gives these very tokens)."""
    pytest.importorskip("llama_cpp", reason="the llama-cpp extra builds llama.cpp from source")
    from services.worker.model.loader import default_path

    patterns = [
        [1203, 5077, 311, 9051, 2411, 777, 30211, 1500, 6230],
        [6230, 1500, 30211, 777, 2411, 9051, 311, 5077, 1203],
        [2500, 8812, 341, 17020, 999],
    ]
    prompts = [(p * 9)[:n] for p, n in zip(patterns, (36, 40, 43), strict=True)]
    expected = [(p * 20)[n : n + 12] for p, n in zip(patterns, (36, 40, 43), strict=True)]
    engine = LlamaCppEngine(default_path(), LlamaCppBudget(1024, 16, 2, 1))
    try:
        assert engine.generate(prompts, [12] * 3, GREEDY, seeds=[0, 0, 0]) == expected
    finally:
        engine.close()
