"""benchmarks/perplexity.py: the windows score every token once, and its quick mode on the real
SmolLM2 gives the figures a reader of the table relies on: the reference agrees with itself
exactly, its perplexity is a language model's on English, and the CPU default (the file's
4-bit weights kept) stays within a hair of it."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from benchmarks import perplexity
from services.worker.model.loader import default_path

SPANS = [(1000, 512, 256), (320, 128, 64), (300, 100, 100), (50, 512, 256)]


@pytest.fixture
def one_thread() -> Iterator[None]:
    """The benchmark's default: on a shared 2-core box two threads spin against other work."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize(("tokens", "window", "stride"), SPANS)
def test_windows_score_each_token_once_after_enough_context(
    tokens: int, window: int, stride: int
) -> None:
    spans = perplexity.windows(tokens, window, stride)
    scored = [token for _, end, first in spans for token in range(first, end)]
    assert scored == list(range(1, tokens))  # token 0 has nothing before it
    for begin, end, first in spans:
        assert end - begin <= window
        assert first - begin >= (window - stride if begin else 1)


def test_windows_refuse_a_stride_that_skips_tokens() -> None:
    with pytest.raises(ValueError, match="stride"):
        perplexity.windows(1000, 128, 256)


@pytest.mark.usefixtures("one_thread")
def test_quick_perplexity_of_the_cpu_default_matches_the_float_reference() -> None:
    path = default_path()
    text, bos = perplexity.text_tokens(path, quick=True)
    settings = [("float32:none", "reference"), ("float32:gguf", "kept 4-bit")]
    window, stride = perplexity.QUICK_WINDOW, perplexity.QUICK_STRIDE
    scores = perplexity.measure(path, settings, text, bos, window, stride)
    reference, kept = (score.summary() for score in scores)
    assert reference["positions"] == kept["positions"] == len(text) - 1
    assert reference["top1_agreement"] == 1.0
    assert reference["mean_kl"] == 0.0 and reference["max_logprob_diff"] == 0.0
    # SmolLM2-135M on the Constitution's opening: about 5.6 (an untrained model: ~49,000).
    assert 2 < reference["perplexity"] < 20
    assert reference["perplexity"] == pytest.approx(math.exp(reference["mean_nll"]))
    assert reference["text_top1"] > 0.4
    # The file's own 4-bit values, summed in float32: the reference's numbers to rounding.
    assert kept["perplexity"] == pytest.approx(reference["perplexity"], rel=0.01)
    assert kept["top1_agreement"] > 0.97
    assert kept["mean_kl"] < 0.01
    lines = perplexity.table("smollm2", path, len(text), [reference, kept]).splitlines()
    assert "no float checkpoint ships" in lines[0]
    assert lines[4].startswith("| reference | ") and "| +0.00% |" in lines[4]
    assert lines[4].endswith("| 100.00% | 0 | 0 |") and lines[5].startswith("| kept 4-bit | ")
