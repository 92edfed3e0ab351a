"""The verifier of proposed tokens keeps the target distribution: over many trials of one
proposal x, the first token emitted follows p_1 (x accepted with probability p_1(x), else the
residual), and the token after an accepted x follows p_2; a verifier with a wrong acceptance
rule fails the same check. Plus the bookkeeping of accept()."""

from __future__ import annotations

import pytest
import torch

from services.common.sampling import SamplingOptions
from services.worker.engine.sampler import Sampler, sampling_probs
from services.worker.engine.sequences import SequenceState
from services.worker.engine.spec_verify import accept, draft_rows, num_emitted
from tests.unit.worker.test_sampler import _chi_square_p

VOCAB = 16
TRIALS = 20_000
PROMPT = [1, 2, 3]


def _state(tokens: list[int], options: SamplingOptions) -> SequenceState:
    return SequenceState("r", list(tokens), len(PROMPT), len(tokens), [[0, 1]], options)


def _target(seed: int) -> torch.Tensor:
    return torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(seed)) * 2


def _verify_many(logits: torch.Tensor, x: int, options: SamplingOptions) -> list[list[int]]:
    """TRIALS independent verifications of the proposal [x] (rows: p_1, then p_2 given x)."""
    states = [_state([*PROMPT, 9, x], options) for _ in range(TRIALS)]
    rows = draft_rows(states, [1] * TRIALS)
    out = Sampler().sample(
        logits.repeat(TRIALS, 1), rows.options, rows.prompt_token_ids, rows.output_token_ids
    )
    emitted = accept(states, [1] * TRIALS, out, block_size=16)
    runs: list[list[int]] = []
    for state in states:
        runs.append(state.output_token_ids[1:])  # after the 9 that was known
    assert sum(len(r) for r in runs) == len(emitted)
    return runs


CASES = [
    SamplingOptions(temperature=1.0),
    SamplingOptions(temperature=0.8, top_p=0.9),
    SamplingOptions(temperature=1.2, top_k=6, min_p=0.02),
]


@pytest.mark.parametrize("options", CASES, ids=["plain", "top-p", "top-k,min-p"])
def test_emitted_tokens_follow_the_target_distribution(options: SamplingOptions) -> None:
    logits = _target(seed=5)
    p = sampling_probs(logits, [options, options])  # [2, V]
    x = int(p[0].argsort(descending=True)[1])  # a likely, not the likeliest, proposal
    torch.manual_seed(0)
    runs = _verify_many(logits, x, options)
    first = torch.tensor([r[0] for r in runs])
    assert _chi_square_p(torch.bincount(first, minlength=VOCAB), p[0]) > 1e-4
    bonus = torch.tensor([r[1] for r in runs if len(r) == 2])
    assert all(len(r) == 1 or r[0] == x for r in runs)  # a second token only after x
    assert _chi_square_p(torch.bincount(bonus, minlength=VOCAB), p[1]) > 1e-4


def _wrong_verifier(p1: torch.Tensor, x: int, generator: torch.Generator) -> int:
    """Accepts x with probability p_1(x), but on rejection draws from p_1 itself rather than
    from the residual: x comes out too often (p + (1 - p) p)."""
    if torch.rand(1, generator=generator) < p1[x]:
        return x
    return int(torch.multinomial(p1, 1, generator=generator))


def _textbook_verifier(p1: torch.Tensor, x: int, generator: torch.Generator) -> int:
    """The rejection sampler as the papers write it, for q = one-hot(x)."""
    if torch.rand(1, generator=generator) < p1[x]:
        return x
    residual = p1.clone()
    residual[x] = 0
    return int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


def test_the_check_fails_a_wrong_acceptance_rule_and_passes_the_textbook_one() -> None:
    options = CASES[1]
    p1 = sampling_probs(_target(seed=5), [options, options])[0]
    x = int(p1.argsort(descending=True)[1])
    generator = torch.Generator().manual_seed(1)
    n = 5_000
    wrong = torch.tensor([_wrong_verifier(p1, x, generator) for _ in range(n)])
    assert _chi_square_p(torch.bincount(wrong, minlength=VOCAB), p1) < 1e-4
    right = torch.tensor([_textbook_verifier(p1, x, generator) for _ in range(n)])
    assert _chi_square_p(torch.bincount(right, minlength=VOCAB), p1) > 1e-4


def test_num_emitted_stops_at_the_first_mismatch_or_takes_the_bonus() -> None:
    assert num_emitted([5, 6, 7], [5, 6, 7, 8]) == 4  # all accepted and the bonus
    assert num_emitted([5, 6, 7], [5, 9, 7, 8]) == 2  # 5, then 9 instead of 6
    assert num_emitted([5, 6, 7], [4, 6, 7, 8]) == 1  # the first proposal rejected


def test_accept_rolls_the_sequence_back_to_what_was_kept() -> None:
    # 3 prompt + 1 known token; 3 proposals; 8 tokens in blocks of 2: 4 blocks.
    state = SequenceState("r", [*PROMPT, 9, 5, 6, 7], 3, 7, [[10, 11, 12, 13]], SamplingOptions())
    out = Sampler().sample(torch.zeros(4, VOCAB), [SamplingOptions()] * 4, [PROMPT] * 4, [[]] * 4)
    out.token_ids = [5, 8, 0, 0]  # 5 accepted, 8 instead of 6
    emitted = accept([state], [3], out, block_size=2)
    assert [s.token_id for s in emitted] == [5, 8]
    assert state.token_ids == [*PROMPT, 9, 5, 8]
    assert state.num_computed == 5  # 8 is computed next step
    assert state.block_tables == [[10, 11, 12]]  # the block wholly past 5 tokens is dropped
