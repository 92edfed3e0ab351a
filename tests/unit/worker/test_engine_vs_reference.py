"""The paged, batched, chunked engine must produce the dense reference's greedy tokens."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from services.worker.engine.plan import StepPlan
from services.worker.model.loader import LoadedModel
from tests.reference_models import greedy_generate
from tests.unit.worker.conftest import RunnerFactory
from tests.unit.worker.plan_driver import Driver

NEW_TOKENS = 20
TEXTS = [
    "Hello",
    "The quick brown fox",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Water boils at one hundred degrees Celsius at sea level, but at the top of a high mountain",
    "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 5, 8, 13, 21, 34,",
    "In the early morning the fishermen pushed their boats into the grey water. The village was "
    "still asleep, and only the gulls watched them go. Far out beyond the harbour wall, the sea "
    "was calmer than it had been all week, and the old captain said that",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide "
    "to make sugar and oxygen. It takes place mainly in the leaves, inside small structures "
    "called chloroplasts, which contain a green pigment named chlorophyll. The energy captured "
    "from light is stored in chemical bonds, and this stored energy later powers the growth of "
    "the plant. Scientists have studied this process for more than two centuries, and",
]


@pytest.fixture(scope="module")
def prompts(tokenizer: Tokenizer) -> list[list[int]]:
    ids = [tokenizer.encode(text).ids for text in TEXTS]
    assert len({len(p) for p in ids}) == len(ids), "prompt lengths should all differ"
    assert max(len(p) for p in ids) > 64, "one prompt should span several 16-token blocks"
    return ids


@pytest.fixture(scope="module")
def expected(smollm: LoadedModel, prompts: list[list[int]]) -> list[list[int]]:
    return [greedy_generate(smollm, prompt, NEW_TOKENS) for prompt in prompts]


def test_one_at_a_time(make_runner: RunnerFactory, prompts: list[list[int]], expected) -> None:
    runner = make_runner()
    for i, prompt in enumerate(prompts):
        driver = Driver(runner)
        driver.add(f"solo{i}", prompt)
        assert driver.run(NEW_TOKENS)[f"solo{i}"] == expected[i], f"prompt {i}"
        runner.execute(StepPlan(finished_ids=[f"solo{i}"]))
    assert runner.num_requests == 0


def test_concurrent_chunked_and_staggered(
    make_runner: RunnerFactory, prompts: list[list[int]], expected
) -> None:
    """Half start together, half join mid-run; prefills go in 24-token chunks beside decodes."""
    runner = make_runner(block_size=16)
    driver = Driver(runner, chunk=24)
    for i in range(0, len(prompts), 2):
        driver.add(f"r{i}", prompts[i])
    for _ in range(3):
        driver.step(NEW_TOKENS)
    for i in range(1, len(prompts), 2):
        driver.add(f"r{i}", prompts[i])
    outputs = driver.run(NEW_TOKENS)
    for i in range(len(prompts)):
        assert outputs[f"r{i}"] == expected[i], f"prompt {i}"


def test_prompt_split_across_two_steps(
    make_runner: RunnerFactory, prompts: list[list[int]], expected
) -> None:
    runner = make_runner(block_size=16)
    prompt = prompts[-1]
    driver = Driver(runner, chunk=len(prompt) // 2 + 1)
    driver.add("split", prompt)
    driver.step(NEW_TOKENS)
    assert driver.seqs["split"].output == [], "no token may be sampled mid-prompt"
    assert driver.run(NEW_TOKENS)["split"] == expected[-1]


def test_prefix_reuse_matches_scratch(
    smollm: LoadedModel, make_runner: RunnerFactory, prompts: list[list[int]]
) -> None:
    """A second request reuses the first's cached blocks for a shared 48-token prefix."""
    driver = Driver(make_runner(block_size=16))
    driver.add("first", prompts[-1])
    driver.run(NEW_TOKENS)
    shared = driver.seqs["first"].tables[0][:3]  # 48 tokens, all of them prompt
    follower = prompts[-1][:48] + prompts[3][:10]
    driver.add("second", follower, cached_tables=[shared], num_cached=48)
    first_plan = driver.plan(NEW_TOKENS)
    assert first_plan.new[0].num_computed_tokens == 48 and first_plan.new[0].num_new_tokens == 10
    driver.seqs["second"].token_ids.append(driver.runner.execute(first_plan)[0].token_id)
    assert driver.run(NEW_TOKENS)["second"] == greedy_generate(smollm, follower, NEW_TOKENS)


def test_resume_after_preemption(
    make_runner: RunnerFactory, prompts: list[list[int]], expected
) -> None:
    """Forgotten mid-generation, then re-sent in full: the tokens continue unchanged."""
    driver = Driver(make_runner(block_size=16))
    driver.add("p", prompts[2])
    driver.add("q", prompts[4])
    for _ in range(6):
        driver.step(NEW_TOKENS)
    driver.preempt("p")
    for _ in range(3):  # q goes on alone, reusing p's freed blocks
        driver.step(NEW_TOKENS)
    outputs = driver.run(NEW_TOKENS)
    assert outputs["p"] == expected[2]
    assert outputs["q"] == expected[4]
