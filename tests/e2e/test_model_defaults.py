"""The model's recommended sampling settings apply to what a request leaves out (README "Model
defaults"): the README's first question, asked without a temperature, gets a sensible answer."""

from __future__ import annotations

from tests.e2e.helpers import post

QUESTION = "What is the capital of France?"
SEEDS = (1, 2, 3, 4)  # seeded sampling is reproducible, whatever else shares the batch


def _answer(stack, **sampling) -> str:
    body = {
        "model": "smollm2-135m-instruct",
        "messages": [{"role": "user", "content": QUESTION}],
        "max_tokens": 24,
        **sampling,
    }
    response = post(stack, "/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_a_request_without_sampling_settings_gets_the_models_own(stack) -> None:
    for seed in SEEDS:
        answer = _answer(stack, seed=seed)
        assert "Paris" in answer
        # Exactly the embedded model's entry in configs/generation_defaults.toml.
        assert answer == _answer(stack, seed=seed, temperature=0.2, top_p=0.9)
    logs = (stack.config.log_dir / "tokenizer.log").read_text()
    assert "sampling defaults temperature=0.2, top_p=0.9" in logs


def test_a_setting_the_client_gives_wins(stack) -> None:
    answers = {_answer(stack, seed=seed, temperature=0) for seed in SEEDS}
    assert len(answers) == 1  # greedy: the seed no longer matters
