"""A prompt whose prefix was computed before is served from the prefix cache: the usage says so,
and the answer is the same."""

from __future__ import annotations

from tests.e2e.helpers import post

SYSTEM = (
    "You are a meticulous assistant for a library. You answer questions about opening hours, "
    "loans, fines and events. Loans last three weeks and can be renewed twice. Fines are ten "
    "cents a day. The library opens at nine and closes at six, and on Sundays at noon. "
) * 3


def _ask(stack, question: str) -> dict:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 16,
    }
    response = post(stack, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_shared_system_prompt_is_served_from_the_cache(stack, scheduler_stats):
    before = scheduler_stats().prefix_hit_tokens
    cold = _ask(stack, "How long is a loan?")
    warm = _ask(stack, "How long is a loan?")
    other = _ask(stack, "When do you open on Sundays?")
    prompt_tokens = cold["usage"]["prompt_tokens"]
    assert prompt_tokens > 150
    cached = warm["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Every full block but the last is reused (the last is recomputed, never shared).
    assert prompt_tokens - 32 <= cached < prompt_tokens
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    # A different question still shares the system prompt's blocks.
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] >= 128
    assert scheduler_stats().prefix_hit_tokens - before >= cached
