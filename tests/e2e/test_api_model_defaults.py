"""The model's recommended sampling settings reach the Anthropic Messages API and the Responses
API too (README "Model defaults"): a request without temperature is sampled as the model says,
not at Anthropic's or OpenAI's temperature 1. The stack here reads a defaults table that makes
the model greedy (temperature 0), so "the model's defaults applied" is an exact answer: the
greedy one, which temperature 1 gives for these questions only by rare chance."""

from __future__ import annotations

import anthropic
import openai
import pytest

from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL
from tests.e2e.helpers import post

pytestmark = pytest.mark.e2e

QUESTIONS = ("What is the capital of France?", "Name three colours.")
MAX_TOKENS = 16


@pytest.fixture
def greedy_stack(smollm_and_gemma: Stack) -> Stack:
    """SmolLM2 at the worker's defaults, made greedy by its defaults table (GREEDY_DEFAULTS in
    tests/e2e/conftest.py), beside Gemma 3 in the package's shared stack."""
    return smollm_and_gemma


def _greedy(stack: Stack, question: str) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    response = post(stack, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_the_stack_reads_the_greedy_table(greedy_stack) -> None:
    logs = (greedy_stack.config.log_dir / "tokenizer.log").read_text()
    assert "sampling defaults temperature=0.0" in logs


def test_the_readmes_first_question_gets_a_sensible_answer_at_the_worker_defaults(
    greedy_stack,
) -> None:
    # This stack's worker runs at its defaults, as `make run` does (on this CPU: the file's
    # 4-bit weights kept, float32 for the rest); its greedy answer is what a newcomer sees at
    # temperature 0. In bfloat16 this file answered "L'Étoile, la Marseillaise, ...".
    logs = (greedy_stack.config.log_dir / "worker0.log").read_text()
    assert "compute dtype float32 on cpu (auto: 4-bit weights" in logs
    assert "weights: quantization gguf (auto:" in logs
    assert "Paris" in _greedy(greedy_stack, "What is the capital of France?")


def test_a_message_without_temperature_is_sampled_as_the_model_says(greedy_stack) -> None:
    # The anthropic SDK has no temperature argument: its users always leave it out.
    claude = anthropic.Anthropic(base_url=greedy_stack.http_url, api_key=API_KEY, max_retries=0)
    for question in QUESTIONS:
        message = claude.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=[{"role": "user", "content": question}]
        )
        assert message.content[0].text == _greedy(greedy_stack, question)


def test_a_response_without_temperature_is_sampled_as_the_model_says(greedy_stack) -> None:
    client = openai.OpenAI(base_url=f"{greedy_stack.http_url}/v1", api_key=API_KEY, max_retries=0)
    for question in QUESTIONS:
        response = client.responses.create(
            model=MODEL, input=question, max_output_tokens=MAX_TOKENS, store=False
        )
        assert response.output_text == _greedy(greedy_stack, question)
        assert response.temperature is None  # the model's value, which the gateway does not know
