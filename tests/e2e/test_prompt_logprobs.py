"""Completions' echo with logprobs on the real model: the prompt's tokens come back with their
logprobs (the first null), computed during prefill (chunked: the stack's step budget is 96
tokens), and they are the logprobs the model gives those tokens when it generates them."""

from __future__ import annotations

import copy
import math

from services.tokenizer.loader import load_tokenizer
from tests.e2e.conftest import MODEL
from tests.e2e.helpers import post
from tests.openai_schema import validate

# Over 96 tokens, so that its prefill takes two chunks.
TEXT = (
    "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
    "It is named after the engineer Gustave Eiffel, whose company designed and built the "
    "tower from 1887 to 1889. Locally nicknamed the Iron Lady, it was constructed as the "
    "centrepiece of the 1889 World's Fair, and to crown the centennial anniversary of the "
    "French Revolution. Although initially criticised by some of France's leading artists and "
    "intellectuals for its design, it has since become a global cultural icon of France."
)


def _complete(stack, prompt, **fields) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, **fields}
    response = post(stack, "/v1/completions", body)
    assert response.status_code == 200, response.text
    return response.json()


def test_echo_returns_the_prompt_with_its_tokens_logprobs(stack) -> None:
    body = _complete(stack, TEXT, echo=True, logprobs=2)
    (choice,) = body["choices"]
    assert choice["text"].startswith(TEXT) and len(choice["text"]) > len(TEXT)
    logprobs = choice["logprobs"]
    prompt_tokens = body["usage"]["prompt_tokens"]
    assert prompt_tokens > 96
    assert len(logprobs["tokens"]) == prompt_tokens + 1  # the prompt's, then the one generated
    assert "".join(logprobs["tokens"][:prompt_tokens]) == TEXT
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    scored = logprobs["token_logprobs"][1:]
    assert all(lp <= 0 for lp in scored)
    assert logprobs["text_offset"][1] == len(logprobs["tokens"][0])
    for token, top in zip(logprobs["tokens"][1:], logprobs["top_logprobs"][1:], strict=True):
        assert token in top and 2 <= len(top) <= 3  # the two best, and the token itself
    # OpenAI's published schema has no null items, though its API sends one for the first
    # token: everything else matches it.
    checked = copy.deepcopy(body)
    for values in checked["choices"][0]["logprobs"].values():
        del values[0]
    validate(checked, "CreateCompletionResponse")


def test_a_prompt_tokens_logprobs_are_those_it_gets_when_generated(stack) -> None:
    """The 5 most likely tokens after 100 prompt tokens (past the first 96-token chunk), as the
    generation of one token there sees them and as scoring the whole prompt sees them."""
    ids = load_tokenizer(None).encode(TEXT)
    generated = _complete(stack, ids[:100], logprobs=5)["choices"][0]["logprobs"]
    scored = _complete(stack, ids, echo=True, logprobs=5)["choices"][0]["logprobs"]
    as_generated, as_scored = generated["top_logprobs"][0], scored["top_logprobs"][100]
    assert generated["tokens"][0] in as_scored
    common = as_generated.keys() & as_scored.keys()
    assert len(common) >= 5
    for token in common:
        assert math.isclose(as_generated[token], as_scored[token], abs_tol=2e-3), token
