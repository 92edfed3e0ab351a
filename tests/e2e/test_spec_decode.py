"""Speculative decoding through the whole stack (the scheduler with --num-speculative-tokens 8
and the adaptive policy, the real model in float32): greedy tokens equal the dense reference's
under concurrency, for prompts whose continuation repeats them (proposals accepted) and others;
a stop string met among accepted proposals ends the text where it would without speculation; a
seeded sampled request gives the same text twice; the scheduler's metrics count the proposals
it made and those accepted."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from services.stack import Stack
from services.tokenizer.loader import load_tokenizer
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack
from tests.e2e.helpers import greedy_tokens, post
from tests.prometheus_text import Scrape
from tests.reference_models import default_model_greedy

NEW_TOKENS = 24
REPEATING = "The quick brown fox jumps over the lazy dog. " * 12
PROMPTS = [
    REPEATING,  # its continuation repeats it: proposals accepted
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):",
    "The capital of Italy is",  # little to look up
    "Photosynthesis is the process by which plants " * 6,
]


@pytest.fixture(scope="module")
def spec_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    (metrics_port,) = free_ports(1)
    config = loopback_config(
        model_name=MODEL,
        scheduler_args=[
            "--max-num-batched-tokens",
            "96",
            "--max-num-seqs",
            "16",
            "--num-speculative-tokens",
            "8",
            "--spec-ngram-min",
            "2",
        ],  # fmt: skip
        # float32: the dense reference's greedy tokens, exactly (see conftest.py's stack).
        worker_args=["--num-blocks", "512", "--dtype", "float32", "--quantization", "none"],
        log_dir=Path(tmp_path_factory.mktemp("spec-stack-logs")),
        env={"LAYERSERVE_API_KEYS": API_KEY},
        metrics_ports={"scheduler": metrics_port},
    )
    stack = start_stack(config)
    yield stack
    stack.stop()


def _generate(stack: Stack, prompt: str) -> list[int]:
    return greedy_tokens(stack, prompt, NEW_TOKENS)


def _scheduler_metrics(stack: Stack) -> Scrape:
    port = stack.config.metrics_ports["scheduler"]
    return Scrape.parse(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


@pytest.fixture(scope="module")
def reference() -> dict[str, list[int]]:
    return dict(zip(PROMPTS, default_model_greedy(PROMPTS, NEW_TOKENS), strict=True))


def test_greedy_tokens_equal_the_reference_with_proposals_accepted(spec_stack, reference):
    before = _scheduler_metrics(spec_stack)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        tokens = pool.map(lambda p: _generate(spec_stack, p), PROMPTS)
        served = dict(zip(PROMPTS, tokens, strict=True))
    for prompt in PROMPTS:
        assert served[prompt] == reference[prompt], f"diverged for {prompt[:40]!r}"
    after = _scheduler_metrics(spec_stack)
    drafts = "layerserve:spec_decode_num_draft_tokens_total"
    accepted = "layerserve:spec_decode_num_accepted_tokens_total"
    proposed = after.value(drafts) - before.value(drafts)
    kept = after.value(accepted) - before.value(accepted)
    # The repeating prompt alone would have had most of its 24 tokens proposed and accepted.
    assert kept >= NEW_TOKENS // 2
    assert kept <= proposed


def test_a_stop_string_among_accepted_proposals_ends_the_text_there(spec_stack, reference):
    tokenizer = load_tokenizer(None)
    full = tokenizer.decode(reference[REPEATING])
    assert "lazy" in full  # the continuation repeats the sentence
    body = {
        "model": MODEL,
        "prompt": REPEATING,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "stop": ["lazy"],
    }
    response = post(spec_stack, "/v1/completions", body)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert choice["text"] == full[: full.index("lazy")]


def test_a_seeded_sampled_request_gives_the_same_text_twice(spec_stack):
    body = {
        "model": MODEL,
        "prompt": REPEATING,
        "max_tokens": NEW_TOKENS,
        "temperature": 0.8,
        "top_p": 0.95,
        "seed": 7,
    }
    texts = []
    for _ in range(2):
        response = post(spec_stack, "/v1/completions", body)
        assert response.status_code == 200, response.text
        texts.append(response.json()["choices"][0]["text"])
    assert texts[0] == texts[1] and texts[0]
