"""Greedy output through the whole stack equals a plain dense reference, token for token,
while the requests share batches with each other and with unrelated traffic."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from tests.e2e.helpers import greedy_tokens
from tests.reference_models import default_model_greedy

NEW_TOKENS = 12
PROMPTS = [
    "The capital of Italy is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "1, 2, 3, 4, 5,",
    "Photosynthesis is the process by which plants " * 8,  # spans several prefill chunks
    "Q: What is the boiling point of water at sea level?\nA:",
    "The quick brown fox jumps over the lazy dog. " * 20,  # ~200 tokens, chunked prefill
    "In 1969, the first humans landed on",
]
NOISE = ["Tell me about the history of Rome. " * n for n in (1, 5, 12)]


def test_greedy_tokens_equal_the_dense_reference_under_concurrency(stack):
    expected = default_model_greedy(PROMPTS, NEW_TOKENS)

    one_at_a_time = [greedy_tokens(stack, p, NEW_TOKENS) for p in PROMPTS[:2]]
    assert one_at_a_time == expected[:2]

    with ThreadPoolExecutor(len(PROMPTS) + len(NOISE)) as pool:
        noise = [pool.submit(greedy_tokens, stack, p, 40) for p in NOISE]
        served = [pool.submit(greedy_tokens, stack, p, NEW_TOKENS) for p in PROMPTS]
        results = [f.result() for f in served]
        assert all(len(f.result()) == 40 for f in noise)
    for prompt, got, want in zip(PROMPTS, results, expected, strict=True):
        assert got == want, f"diverged for {prompt[:40]!r}"
