"""Admission resolves max_tokens once: a cap is lowered to what fits, a strict one must fit."""

from __future__ import annotations

import pytest

from services.common.errors import InvalidArgument
from services.common.max_tokens import MaxTokens
from services.common.sampling import SamplingOptions
from services.scheduler.admission import ModelLimits, admit

# A context of 32 tokens and a KV cache of 16 blocks x 4 = 64: the context is what binds.
CONTEXT = ModelLimits(
    max_model_len=32, vocab_size=100, block_size=4, num_blocks=16, eos_token_ids=frozenset({2})
)
# A KV cache of 4 blocks x 4 = 16 tokens, smaller than the context of 32.
SMALL_CACHE = ModelLimits(
    max_model_len=32, vocab_size=100, block_size=4, num_blocks=4, eos_token_ids=frozenset({2})
)


def _admit(prompt_len: int, max_tokens: MaxTokens, limits: ModelLimits = CONTEXT) -> int:
    request = admit(
        request_id="r",
        prompt_token_ids=[5] * prompt_len,
        max_tokens=max_tokens,
        sampling=SamplingOptions(),
        stop_token_ids=[],
        ignore_eos=False,
        priority=0,
        trace_context={},
        limits=limits,
    )
    return request.max_tokens


def test_a_cap_is_lowered_to_what_fits_in_the_context():
    assert _admit(24, MaxTokens.cap(1024)) == 8  # 32 - 24
    assert _admit(4, MaxTokens.cap(10)) == 10  # it fits: kept


def test_a_cap_is_lowered_to_what_fits_in_the_kv_cache():
    assert _admit(10, MaxTokens.cap(1024), SMALL_CACHE) == 6  # 16 - 10


def test_a_strict_max_tokens_that_does_not_fit_is_refused_naming_max_tokens():
    assert _admit(4, MaxTokens(10)) == 10
    with pytest.raises(InvalidArgument, match="maximum context length") as err:
        _admit(24, MaxTokens(1024))
    assert err.value.param == "max_tokens"
    with pytest.raises(InvalidArgument, match="KV cache") as err:
        _admit(10, MaxTokens(10), SMALL_CACHE)
    assert err.value.param == "max_tokens"


def test_unset_means_as_many_as_fit():
    assert _admit(24, MaxTokens()) == 8
    assert _admit(10, MaxTokens(), SMALL_CACHE) == 6


def test_a_prompt_that_fills_the_context_is_refused_even_with_a_cap():
    with pytest.raises(InvalidArgument, match="maximum context length") as err:
        _admit(32, MaxTokens.cap(16))
    assert err.value.param == "prompt"


def test_a_negative_max_tokens_is_refused():
    with pytest.raises(InvalidArgument, match="max_tokens must be positive"):
        _admit(4, MaxTokens(-1))
