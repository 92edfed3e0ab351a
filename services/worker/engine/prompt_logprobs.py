"""Prompt logprobs (SamplingParams.prompt_logprobs): the logprob of each prompt token given the
ones before it, from the hidden states of the prefill chunk that computes the position before
it, kept on the sequence until its first token is sampled (plan.Sampled.prompt_logprobs).

Position p's logits predict token p + 1, so a chunk over positions [s, s + n) scores the prompt
tokens s + 1 .. min(s + n, P - 1) (P: the prompt's length); the last prompt position predicts
the first output token, which the sampler scores as usual. The scheduler gives such a request
no cached prefix, so every position is computed here. Logits are taken _ROWS at a time: a
chunk of thousands of positions x the vocabulary at once would take gigabytes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from services.worker.engine.sequences import SequenceState

_ROWS = 256  # positions per output-head pass: [256, V] float32 is 50 MB for V = 49152

# (the prompt token, its logprob, the top alternatives (token, logprob), most likely first)
PromptLogprob = tuple[int, float, list[tuple[int, float]]]


class ScheduledChunk(Protocol):
    state: SequenceState  # num_computed not yet advanced past this step's tokens
    num_new: int


def collect_prompt_logprobs(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    last_rows: torch.Tensor,
    scheduled: Sequence[ScheduledChunk],
) -> None:
    """Appends to each sequence that asked (its state.prompt_logprobs) the logprobs of the
    prompt tokens this step's chunk predicts. hidden [T, d]: the step's rows; last_rows [S]:
    the last row of each scheduled sequence, in order."""
    rows: list[int] = []
    targets: list[int] = []
    owners: list[SequenceState] = []
    for i, item in enumerate(scheduled):
        state = item.state
        if state.sampling.prompt_logprobs is None:
            continue
        start = state.num_computed
        end = min(start + item.num_new, state.num_prompt_tokens - 1)
        if end <= start:
            continue
        first_row = int(last_rows[i]) - item.num_new + 1
        rows.extend(range(first_row, first_row + end - start))
        targets.extend(state.token_ids[start + 1 : end + 1])
        owners.extend([state] * (end - start))
    for begin in range(0, len(rows), _ROWS):
        _score(compute_logits, hidden, rows, targets, owners, begin)


def _score(
    compute_logits: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    rows: list[int],
    targets: list[int],
    owners: list[SequenceState],
    begin: int,
) -> None:
    end = min(begin + _ROWS, len(rows))
    index = torch.tensor(rows[begin:end], device=hidden.device)
    logprobs = torch.log_softmax(compute_logits(hidden[index]), dim=-1)  # [R, V] float32
    wanted = torch.tensor(targets[begin:end], device=hidden.device)
    chosen = logprobs.gather(1, wanted[:, None]).squeeze(1).tolist()
    max_top = max(owner.sampling.prompt_logprobs or 0 for owner in owners[begin:end])
    top_ids: list[list[int]] = [[] for _ in chosen]
    top_values: list[list[float]] = [[] for _ in chosen]
    if max_top:
        values, ids = logprobs.topk(max_top, dim=-1)
        top_ids, top_values = ids.tolist(), values.tolist()
    for j, logprob in enumerate(chosen):
        owner = owners[begin + j]
        k = owner.sampling.prompt_logprobs or 0
        top = list(zip(top_ids[j][:k], top_values[j][:k], strict=True))
        owner.prompt_logprobs.append((targets[begin + j], logprob, top))
