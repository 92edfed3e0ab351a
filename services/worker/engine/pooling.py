"""Embeddings (SamplingParams.pooling): a sequence's prompt pooled from the final-normed hidden
states (the output head's input) of the chunks that compute it, L2-normalised, and kept on the
sequence until its first token is sampled (plan.Sampled.embedding).

"last" takes the last prompt position's row (a decoder's only position that has read the
whole prompt; the prefix cache always leaves it to be computed); "mean" sums the rows of every
prompt position chunk by chunk (the scheduler gives such a request no cached prefix) and
divides by the prompt's length."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from services.worker.engine.prompt_logprobs import ScheduledChunk


def pool_prompts(
    hidden: torch.Tensor, last_rows: torch.Tensor, scheduled: Sequence[ScheduledChunk]
) -> None:
    """Pools the prompt rows of this step into each sequence that asked (state.pooled_sum,
    then state.embedding once its prompt is complete). hidden [T, d]; last_rows [S]."""
    for i, item in enumerate(scheduled):
        state = item.state
        mode = state.sampling.pooling
        if mode is None:
            continue
        start, prompt = state.num_computed, state.num_prompt_tokens
        end = min(start + item.num_new, prompt)
        if end <= start:
            continue  # a recomputed sequence's output tokens, or its decode
        first_row = int(last_rows[i]) - item.num_new + 1
        if mode == "mean":
            chunk = hidden[first_row : first_row + end - start].float().sum(dim=0)  # [d]
            state.pooled_sum = chunk if state.pooled_sum is None else state.pooled_sum + chunk
        if end < prompt:
            continue  # more of the prompt in later steps
        if mode == "mean":
            vector, state.pooled_sum = state.pooled_sum / prompt, None
        else:
            vector = hidden[first_row + prompt - 1 - start].float()  # [d]
        state.embedding = F.normalize(vector, dim=0).tolist()
