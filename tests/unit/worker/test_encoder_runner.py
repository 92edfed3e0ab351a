"""The BERT encoder (model/bert.py) and its runner (engine/encoder_runner.py) on the packaged
all-MiniLM-L6-v2: sentence-transformers' vectors (transformers' BertModel, mean pooling,
L2-normalised), whatever way the scheduler chunks and batches the prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from services.common.errors import InvalidArgument
from services.common.sampling import SamplingOptions
from services.tokenizer.loader import load_tokenizer
from services.worker.engine.encoder_runner import EncoderRunner
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan
from services.worker.model import registry
from services.worker.model.packaged import ALL_MINILM_L6_V2, package_dir, packaged_path

CHECKPOINT = package_dir(ALL_MINILM_L6_V2.package) / ALL_MINILM_L6_V2.subdir
TEXTS = ["The cat sits on the mat", "A kitten is resting on a rug", "Stock markets fell sharply"]
MEAN = SamplingOptions(pooling="mean")


@pytest.fixture(scope="module")
def runner() -> EncoderRunner:
    return EncoderRunner.create(CHECKPOINT, model_name="all-minilm-l6-v2", block_size=4)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    model = load_tokenizer(CHECKPOINT)
    return [model.encode(text) for text in TEXTS]


def _new(rid: str, prompt: list[int], num_new: int, sampling=MEAN) -> NewSequence:
    blocks = list(range(len(prompt) // 4 + 1))
    return NewSequence(rid, prompt, len(prompt), 0, num_new, [blocks], sampling)


def _embed_whole(runner: EncoderRunner, prompts: list[list[int]]) -> list[list[float]]:
    plan = StepPlan(new=[_new(f"w{i}", p, len(p)) for i, p in enumerate(prompts)])
    out = runner.execute(plan)
    runner.execute(StepPlan(finished_ids=[s.request_id for s in out]))
    return [s.embedding for s in out]


def test_the_checkpoint_is_an_encoder_and_the_default_model_is_not() -> None:
    assert registry.is_encoder(CHECKPOINT)
    assert not registry.is_encoder(None)


def test_vectors_match_transformers_mean_pooled(runner, prompts) -> None:
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoModel.from_pretrained(CHECKPOINT).eval()
    ours = torch.tensor(_embed_whole(runner, prompts))  # one padded batch of three lengths
    with torch.no_grad():
        for prompt, vector in zip(prompts, ours, strict=True):
            hidden = reference(torch.tensor([prompt])).last_hidden_state[0]  # [n, 384]
            expected = F.normalize(hidden.mean(dim=0), dim=0)
            torch.testing.assert_close(vector, expected, atol=1e-5, rtol=0)


def test_related_sentences_score_above_unrelated_ones(runner, prompts) -> None:
    cat, kitten, markets = (torch.tensor(v) for v in _embed_whole(runner, prompts))
    assert float(cat @ kitten) > 0.5 > 0.2 > max(float(cat @ markets), float(kitten @ markets))


def test_a_prompt_chunked_across_steps_gets_the_vector_of_one_step(runner, prompts) -> None:
    prompt = prompts[1]
    whole = _embed_whole(runner, [prompt])[0]
    assert runner.execute(StepPlan(new=[_new("c", prompt, 3)])) == []  # nothing until the end
    rest = RunningSequence("c", len(prompt) - 3, [[]])
    (sampled,) = runner.execute(StepPlan(running=[rest]))
    assert sampled.request_id == "c" and sampled.error is None
    assert sampled.embedding == pytest.approx(whole, abs=1e-6)
    runner.execute(StepPlan(finished_ids=["c"]))
    assert runner.num_requests == 0


def test_a_request_for_text_is_refused(runner, prompts) -> None:
    (sampled,) = runner.execute(
        StepPlan(new=[_new("g", prompts[0], len(prompts[0]), SamplingOptions())])
    )
    assert isinstance(sampled.error, InvalidArgument)
    assert "/v1/embeddings" in sampled.error.message
    runner.execute(StepPlan(finished_ids=["g"]))


def test_a_plan_past_the_model_length_leaves_the_runner_untouched(runner) -> None:
    long = [101] + [1996] * 600 + [102]
    with pytest.raises(ValueError):
        runner.execute(StepPlan(new=[_new("x", long, 16)]))
    assert runner.num_requests == 0


def test_the_cache_links_the_installed_checkpoint(tmp_path: Path) -> None:
    link = packaged_path(ALL_MINILM_L6_V2.name, tmp_path)
    assert link == tmp_path / ALL_MINILM_L6_V2.name and link.resolve() == CHECKPOINT.resolve()
    link.unlink()
    link.symlink_to(tmp_path)  # stale: another install's site-packages
    assert packaged_path(ALL_MINILM_L6_V2.name, tmp_path).resolve() == CHECKPOINT.resolve()
