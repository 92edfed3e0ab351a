"""Prompt logprobs and embeddings from the paged, chunked engine match the dense reference:
the logprob of each prompt token given the ones before it, and the prompt's pooled
final-normed hidden state (mean or last position, L2-normalised), with the first token."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from services.common.sampling import SamplingOptions
from services.worker.engine.plan import Sampled
from services.worker.model.loader import LoadedModel
from tests.reference_models import llama_reference
from tests.unit.worker.conftest import RunnerFactory
from tests.unit.worker.plan_driver import Driver

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."


def _first_tokens(driver: Driver) -> dict[str, Sampled]:
    """Steps until every sequence has sampled its first token; those Sampled, by request."""
    first: dict[str, Sampled] = {}
    while len(first) < len(driver.seqs):
        for sampled in driver.runner.execute(driver.plan(1)):
            driver.seqs[sampled.request_id].token_ids.append(sampled.token_id)
            first.setdefault(sampled.request_id, sampled)
    return first


@pytest.mark.parametrize("chunk", [7])  # several prefill chunks
def test_prompt_logprobs_and_embeddings_match_the_dense_reference(
    make_runner: RunnerFactory, smollm: LoadedModel, tokenizer: Tokenizer, chunk: int
) -> None:
    prompt = tokenizer.encode(TEXT).ids
    hidden = llama_reference.dense_hidden(smollm.model, prompt)  # [P, d]
    logprobs = torch.log_softmax(llama_reference.dense_logits(smollm.model, hidden[:-1]), -1)
    driver = Driver(make_runner(), chunk=chunk)
    driver.add("scored", prompt, SamplingOptions(prompt_logprobs=2))
    driver.add("mean", prompt, SamplingOptions(pooling="mean"))
    driver.add("last", prompt, SamplingOptions(pooling="last"))
    driver.add("plain", prompt)
    first = _first_tokens(driver)

    scored = first["scored"].prompt_logprobs
    assert [token for token, _, _ in scored] == prompt[1:]
    expected = logprobs.gather(1, torch.tensor(prompt[1:])[:, None]).squeeze(1)
    assert torch.allclose(torch.tensor([lp for _, lp, _ in scored]), expected, atol=1e-3)
    best = logprobs.topk(2, dim=-1)
    assert [[t for t, _ in top] for _, _, top in scored] == best.indices.tolist()

    for mode, vector in (("mean", hidden.mean(dim=0)), ("last", hidden[-1])):
        got = torch.tensor(first[mode].embedding)
        assert got.shape == (hidden.shape[1],) and abs(float(got.norm()) - 1) < 1e-4
        assert float(F.cosine_similarity(got, vector, dim=0)) > 0.9999, mode
    assert first["plain"].prompt_logprobs == [] and first["plain"].embedding is None
    assert first["mean"].prompt_logprobs == [] and first["scored"].embedding is None
