"""Streaming: deltas concatenate to the non-streamed text, never split a character, and a
client that goes away gets its KV blocks freed."""

from __future__ import annotations

import time

import httpx

from tests.e2e.conftest import MODEL
from tests.e2e.helpers import AUTH, chat_body, post, sse_events, stream
from tests.openai_schema import validate

MULTIBYTE_PROMPTS = [
    "Write the word 'cat' in Japanese, Chinese and Korean, then add three animal emoji.",
    "Reply with five emoji that describe a sunny day at the beach.",
]


def _chat_text(stack, prompt: str) -> str:
    body = post(stack, "/v1/chat/completions", chat_body(prompt, max_tokens=48)).json()
    return body["choices"][0]["message"]["content"]


def test_streamed_deltas_equal_the_non_streamed_text_without_split_characters(stack):
    saw_multibyte = False
    for prompt in MULTIBYTE_PROMPTS:
        expected = _chat_text(stack, prompt)
        chunks = stream(stack, "/v1/chat/completions", chat_body(prompt, max_tokens=48))[:-1]
        deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
        for delta in deltas:
            assert "\ufffd" not in delta, f"a delta split a character: {delta!r}"
        assert "".join(deltas) == expected
        saw_multibyte |= any(ord(ch) > 0x7FF for ch in expected)
    # The prompts are chosen so that the model answers with 3- and 4-byte characters; if it
    # stops doing so, this test no longer tests what it claims.
    assert saw_multibyte


def test_completion_stream_equals_non_stream(stack):
    body = {
        "model": MODEL,
        "prompt": "The three primary colours are",
        "max_tokens": 24,
        "temperature": 0,
    }
    expected = post(stack, "/v1/completions", body).json()["choices"][0]["text"]
    chunks = stream(stack, "/v1/completions", body)[:-1]
    for chunk in chunks:
        validate(chunk, "CreateCompletionStreamResponse")
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected


def test_stop_string_ends_the_text_before_it(stack):
    prompt = "Count from one to ten, separated by commas."
    full = _chat_text(stack, prompt)
    # A stop string taken from the middle of the answer, at its first occurrence: with digits
    # each a token of its own, three characters straddle token boundaries.
    start = next(i for i in range(len(full) // 3, len(full) - 3) if full.find(full[i : i + 3]) == i)
    body = chat_body(prompt, max_tokens=48, stop=[full[start : start + 3]])
    response = post(stack, "/v1/chat/completions", body).json()
    assert response["choices"][0]["message"]["content"] == full[:start]
    assert response["choices"][0]["finish_reason"] == "stop"
    streamed = stream(stack, "/v1/chat/completions", body)[:-1]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed)
    assert text == full[:start]


def _wait_idle(scheduler_stats, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = scheduler_stats()
        if stats.running == 0 and stats.waiting == 0:
            return stats
        time.sleep(0.1)
    return scheduler_stats()


def test_client_disconnect_frees_kv_blocks(stack, scheduler_stats):
    before = _wait_idle(scheduler_stats)
    assert before.free_blocks == before.num_blocks
    body = chat_body(
        "Tell me a very long story about a dragon.", max_tokens=1000, ignore_eos=True, stream=True
    )
    for _ in range(3):
        with httpx.stream(
            "POST", f"{stack.http_url}/v1/chat/completions", json=body, headers=AUTH, timeout=60
        ) as response:
            events = sse_events(response)
            for _ in range(3):
                next(events)
            assert scheduler_stats().free_blocks < before.free_blocks  # it holds blocks now
        # leaving the block closes the connection mid-stream
    after = _wait_idle(scheduler_stats)
    assert after.running == 0
    assert after.free_blocks == before.free_blocks
