"""An embedding generates nothing: the stack computes the prompt and answers with its vector,
so the key is charged for the prompt tokens alone (GET /v1/usage), as the response's usage says
(OpenAI's embeddings usage has prompt_tokens and total_tokens only)."""

from __future__ import annotations

import time

import httpx

from services.stack import Stack
from tests.e2e.conftest import MODEL
from tests.e2e.helpers import AUTH, post

TEXTS = ["The cat sat on the mat.", "Paris is the capital of France."]


def _usage(stack: Stack) -> dict:
    response = httpx.get(f"{stack.http_url}/v1/usage", headers=AUTH, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _usage_after(stack: Stack, requests: int, timeout_s: float = 30.0) -> dict:
    """The key's counters once they count `requests` (the charge is settled as the request
    ends, which may be just after its answer went out)."""
    deadline = time.monotonic() + timeout_s
    while (usage := _usage(stack))["requests"] < requests and time.monotonic() < deadline:
        time.sleep(0.1)
    return usage


def test_an_embedding_is_charged_for_its_prompt_only(stack) -> None:
    before = _usage(stack)
    response = post(stack, "/v1/embeddings", {"model": MODEL, "input": TEXTS})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage == {"prompt_tokens": usage["prompt_tokens"], "total_tokens": usage["total_tokens"]}
    assert usage["prompt_tokens"] == usage["total_tokens"] > len(TEXTS)
    after = _usage_after(stack, before["requests"] + 1)
    assert after["requests"] == before["requests"] + 1
    assert after["prompt_tokens"] - before["prompt_tokens"] == usage["prompt_tokens"]
    assert after["completion_tokens"] == before["completion_tokens"]
