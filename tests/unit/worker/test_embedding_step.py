"""An embedding request samples no token: the step that completes its prompt answers with its
vector, and the output head runs only for the sequences that do generate (in one batch with
the embedding)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from services.common.sampling import SamplingOptions
from services.worker.model.loader import LoadedModel
from tests.unit.worker.conftest import RunnerFactory
from tests.unit.worker.plan_driver import Driver

TEXT = "The quick brown fox jumps over the lazy dog."


def test_an_embedding_step_samples_only_for_generation(
    make_runner: RunnerFactory,
    smollm: LoadedModel,
    tokenizer: Tokenizer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    head_rows: list[int] = []
    compute_logits = smollm.model.compute_logits

    def counted(hidden: torch.Tensor) -> torch.Tensor:
        head_rows.append(hidden.shape[0])
        return compute_logits(hidden)

    monkeypatch.setattr(smollm.model, "compute_logits", counted)
    prompt = tokenizer.encode(TEXT).ids
    driver = Driver(make_runner())
    driver.add("embedding", prompt, SamplingOptions(pooling="last"))
    driver.add("text", prompt)
    results = {s.request_id: s for s in driver.runner.execute(driver.plan(1))}
    assert results["embedding"].embedding is not None and results["text"].embedding is None
    assert head_rows == [1]  # the text's next token; none for the embedding
    head_rows.clear()
    alone = Driver(make_runner())
    alone.add("embedding", prompt, SamplingOptions(pooling="mean"))
    (answer,) = alone.runner.execute(alone.plan(1))
    assert answer.embedding is not None and head_rows == []
