"""Speculative decoding, the worker's half: verifying the tokens the scheduler proposed.

A sequence with d proposed tokens x_1..x_d (RunningSequence.draft_token_ids) is computed with
them appended, and its logits are taken at the 1 + d last positions: row j (0..d) is the
distribution of output position n + j (n: its output tokens before the step), given the known
tokens and x_1..x_j. Every row is sampled by the ordinary Sampler, exactly as a step without
proposals would sample that position: the same penalties (over the outputs before it,
proposals included), the same temperature, top-k, top-p and min-p, and for a seeded request
the same uniform u = f(seed, n + j). The sequence then emits rows' tokens t_0, t_1, ... up to
and including the first t_j != x_{j+1} (or t_d, the bonus token, when every proposal matched).

Why this is exact:
- Greedy rows: t_j is the argmax, so the output is the non-speculative one token for token.
- Sampled rows: t_j = F_j^-1(u_j), a draw from the target distribution p_j. It is the
  rejection sampler of speculative sampling (Leviathan et al.; Chen et al.) for a proposer that
  puts all its mass on x (q = one-hot): x is accepted with probability p_j(x) = min(1, p/q),
  and on rejection the token emitted is F_j^-1(u_j) given that it is not x, i.e. a draw from
  the residual max(0, p_j - q) renormalised (p_j without x); after d acceptances t_d is the
  bonus draw from p_d. So each emitted token follows the target distribution, and the
  acceptance rate is the best any verifier of a deterministic proposer can reach.
- Seeds: u_j depends only on (seed, output position), so a seeded request emits the same tokens
  with or without speculation, whatever was proposed or accepted, as it does after a
  preemption. ("The same" up to floating point: a position computed among 1 + d queries may
  round differently from one computed alone, which can flip an exact near-tie.)

Logprobs are each row's, as without speculation. Sequences with an output constraint are never
sent proposals (the scheduler does not speculate for them; validate_plan refuses it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.common.sampling import SamplingOptions
from services.worker.engine.plan import Sampled
from services.worker.engine.sampler import SampleOutput
from services.worker.engine.sequences import SequenceState


@dataclass(slots=True)
class DraftRows:
    """The Sampler's inputs for the 1 + d rows of each sequence, sequence after sequence."""

    options: list[SamplingOptions]
    prompt_token_ids: list[list[int]]
    output_token_ids: list[list[int]]  # row j: the outputs before it, x_1..x_j included


def draft_rows(states: list[SequenceState], num_drafts: list[int]) -> DraftRows:
    """states: sequences whose token_ids end with their num_drafts[i] proposed tokens."""
    rows = DraftRows([], [], [])
    for state, d in zip(states, num_drafts, strict=True):
        prompt = state.token_ids[: state.num_prompt_tokens]
        known = len(state.token_ids) - d
        for j in range(d + 1):
            rows.options.append(state.sampling)
            rows.prompt_token_ids.append(prompt)
            rows.output_token_ids.append(state.token_ids[state.num_prompt_tokens : known + j])
    return rows


def logit_rows(
    last_rows: torch.Tensor, plain: list[int], drafted: list[tuple[int, int]]
) -> torch.Tensor:
    """The rows of a step's hidden states whose logits it needs: the last row (last_rows [S])
    of each sequence index in `plain`, then the 1 + d last rows of each (index, d) in
    `drafted`, in that order."""
    offsets = [torch.zeros(1, dtype=torch.int64)] * len(plain)
    offsets += [-torch.arange(d, -1, -1) for _, d in drafted]
    index = torch.tensor(plain + [i for i, _ in drafted], device=last_rows.device)
    ends = last_rows[index]
    return torch.cat([end + o.to(ends.device) for end, o in zip(ends, offsets, strict=True)])


def num_emitted(drafts: list[int], sampled: list[int]) -> int:
    """How many of the rows' tokens `sampled` ([d + 1]) the sequence emits: the proposals that
    match, then the first token that does not (or the bonus)."""
    for j, draft in enumerate(drafts):
        if sampled[j] != draft:
            return j + 1
    return len(drafts) + 1


def accept(
    states: list[SequenceState], num_drafts: list[int], out: SampleOutput, block_size: int
) -> list[Sampled]:
    """Applies the sampled rows (out, in draft_rows' order) to each sequence: the proposals
    kept and the token after them replace its proposed tokens, its computed tokens end before
    that last token, and each block table drops the blocks wholly beyond them (the scheduler's
    KVCacheManager.trim frees the same blocks). Returns the emitted tokens, in order."""
    results: list[Sampled] = []
    start = 0
    for state, d in zip(states, num_drafts, strict=True):
        known = len(state.token_ids) - d
        tokens = out.token_ids[start : start + d + 1]
        n = num_emitted(state.token_ids[known:], tokens)
        del state.token_ids[known:]
        state.token_ids.extend(tokens[:n])
        state.num_computed = known + n - 1
        keep = -(-state.num_computed // block_size)
        for table in state.block_tables:
            del table[keep:]
        for row in range(start, start + n):
            token = out.token_ids[row]
            results.append(
                Sampled(state.request_id, token, out.logprobs[row], out.top_logprobs[row])
            )
        start += d + 1
    return results
