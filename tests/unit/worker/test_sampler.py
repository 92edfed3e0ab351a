"""Sampler semantics on small hand-made logits."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.sampling import SamplingOptions
from services.worker.engine import sampler
from services.worker.engine.sampler import (
    Sampler,
    apply_penalties,
    draw,
    sampling_probs,
    uniforms,
)

VOCAB = 64


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


def _sample(logits: torch.Tensor, options: list[SamplingOptions], outputs=None):
    prompts = [[1, 2, 3] for _ in options]
    return Sampler().sample(logits, options, prompts, outputs or [[] for _ in options])


def test_greedy_is_argmax_and_top_k_1_matches() -> None:
    logits = _logits(6)
    greedy = _sample(logits, [SamplingOptions()] * 6).token_ids
    assert greedy == logits.argmax(-1).tolist()
    top1 = [SamplingOptions(temperature=1.5, top_k=1, seed=i) for i in range(6)]
    assert _sample(logits, top1).token_ids == greedy


def test_seeded_rows_reproducible_and_independent_of_neighbours() -> None:
    logits = _logits(5, seed=1)
    seeded = SamplingOptions(temperature=1.0, seed=1234)
    alone = _sample(logits[2:3], [seeded], [[7, 8]]).token_ids[0]
    for trial in range(3):
        torch.manual_seed(trial)  # the neighbours draw from the global RNG
        others = [SamplingOptions(temperature=1.0)] * 5
        others[2] = seeded
        outputs = [[], [5], [7, 8], [], [1, 1, 1]]
        assert _sample(logits, others, outputs).token_ids[2] == alone
    # The step counter moves the stream on: the same seed at another step draws afresh.
    draws = {_sample(logits[2:3], [seeded], [[0] * n]).token_ids[0] for n in range(40)}
    assert len(draws) > 3


def test_repetition_penalty_hf_semantics() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, -1.0, 0.5]])
    options = [SamplingOptions(repetition_penalty=2.0)]
    apply_penalties(logits, options, [[0, 1]], [[2]])
    # Seen tokens 0, 1 (prompt) and 2 (output): positive halved, negative doubled.
    assert logits.tolist() == [[1.0, -4.0, 0.5, -1.0, 0.5]]


def test_presence_and_frequency_penalties_output_only() -> None:
    logits = torch.zeros(1, 5)
    options = [SamplingOptions(presence_penalty=0.5, frequency_penalty=0.25)]
    apply_penalties(logits, options, [[4, 4, 4]], [[1, 1, 1, 2]])
    # Token 1 seen 3 times: 0.5 + 3 * 0.25; token 2 once: 0.5 + 0.25; prompt tokens untouched.
    assert logits.tolist() == [[0.0, -1.25, -0.75, 0.0, 0.0]]


def test_penalties_leave_other_rows_alone() -> None:
    logits = _logits(3)
    before = logits.clone()
    options = [SamplingOptions(), SamplingOptions(repetition_penalty=1.5), SamplingOptions()]
    apply_penalties(logits, options, [[0, 1, 2]] * 3, [[3, 4]] * 3)
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert not torch.equal(logits[1], before[1])


def test_logprobs_normalised_and_top_n_ordered() -> None:
    logits = _logits(3)
    options = [SamplingOptions(logprobs=5), SamplingOptions(), SamplingOptions(logprobs=0)]
    out = _sample(logits, options)
    expected = torch.log_softmax(logits, -1)
    top = out.top_logprobs[0]
    assert [t for t, _ in top] == expected[0].topk(5).indices.tolist()
    values = [v for _, v in top]
    assert values == sorted(values, reverse=True)
    assert out.logprobs[0] == pytest.approx(expected[0, out.token_ids[0]].item(), abs=1e-5)
    assert out.logprobs[1] is None and out.top_logprobs[1] == []
    assert out.logprobs[2] is not None and out.top_logprobs[2] == []
    assert math.isclose(sum(math.exp(v) for v in expected[0].tolist()), 1.0, rel_tol=1e-4)


def test_logprobs_are_after_penalties_before_temperature() -> None:
    logits = _logits(1)
    options = [SamplingOptions(temperature=0.5, repetition_penalty=1.3, logprobs=1, seed=3)]
    out = Sampler().sample(logits, options, [[0, 5]], [[]])
    penalised = logits.clone()
    apply_penalties(penalised, options, [[0, 5]], [[]])
    expected = torch.log_softmax(penalised, -1)[0]
    assert out.logprobs[0] == pytest.approx(expected[out.token_ids[0]].item(), abs=1e-5)


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    options = [SamplingOptions(temperature=1.0, top_p=0.8)]
    kept = sampling_probs(probs.log(), options)
    assert (kept[0] > 0).tolist() == [True, True, False, False]
    assert kept[0].sum().item() == pytest.approx(1.0)
    tiny = sampling_probs(probs.log(), [SamplingOptions(temperature=1.0, top_p=0.01)])
    assert (tiny[0] > 0).tolist() == [True, False, False, False]


def test_min_p_and_top_k_masks() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    min_p = sampling_probs(probs.log(), [SamplingOptions(temperature=1.0, min_p=0.2)])
    assert (min_p[0] > 0).tolist() == [True, True, True, False]  # threshold 0.1
    top_k = sampling_probs(probs.log(), [SamplingOptions(temperature=1.0, top_k=2)])
    assert top_k[0].tolist() == pytest.approx([0.625, 0.375, 0.0, 0.0])


def test_mixed_batch_masks_apply_per_row() -> None:
    logits = _logits(3)
    options = [
        SamplingOptions(temperature=1.0, top_k=3),
        SamplingOptions(temperature=1.0),
        SamplingOptions(temperature=1.0, top_p=0.5),
    ]
    probs = sampling_probs(logits, options)
    assert int((probs[0] > 0).sum()) == 3
    assert int((probs[1] > 0).sum()) == VOCAB
    assert 1 <= int((probs[2] > 0).sum()) < VOCAB


def test_temperature_sampling_follows_distribution() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]]).repeat(4000, 1)
    torch.manual_seed(0)
    tokens = _sample(logits, [SamplingOptions(temperature=1.0)] * 4000).token_ids
    assert 0.72 < sum(tokens) / len(tokens) < 0.78  # P(token 1) = 0.75


@pytest.mark.parametrize(
    "extreme",
    [
        {"temperature": 1e-40},
        {"temperature": 1.0, "repetition_penalty": 1e-40},
        {"temperature": 2.0, "repetition_penalty": 1e-38, "presence_penalty": 2.0},
    ],
)
def test_legal_extremes_sample_a_token_instead_of_failing_the_step(extreme) -> None:
    """Values every validator accepts must not turn a row's distribution into NaN: that would
    fail the whole batch's step, every other request with it."""
    logits = _logits(2)
    options = [SamplingOptions(**extreme, seed=3, logprobs=1), SamplingOptions()]
    out = _sample(logits, options, outputs=[[4, 5], [6]])
    assert out.token_ids[1] == int(logits[1].argmax())  # the neighbour is untouched
    assert 0 <= out.token_ids[0] < logits.shape[1]
    if extreme["temperature"] < 1e-5:  # too cold to divide by: greedy
        assert out.token_ids[0] == int(logits[0].argmax())


def _chi_square_p(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of observed counts [V] under probs [V] (chi-square, Wilson-Hilferty)."""
    n = float(observed.sum())
    kept = probs > 0
    assert observed[~kept].sum() == 0, "drew a token the reference never draws"
    expected = probs[kept].double() * n
    stat = float(((observed[kept].double() - expected) ** 2 / expected).sum())
    df = int(kept.sum()) - 1
    if df == 0:
        return 1.0
    z = ((stat / df) ** (1 / 3) - (1 - 2 / (9 * df))) / math.sqrt(2 / (9 * df))
    return 0.5 * math.erfc(z / math.sqrt(2))


DISTRIBUTION_CASES = [
    {"temperature": 1.0},
    {"temperature": 0.7, "top_p": 0.9},
    {"temperature": 1.3, "top_k": 5},
    {"temperature": 1.0, "min_p": 0.05},
    {"temperature": 0.8, "top_k": 20, "top_p": 0.6, "min_p": 0.02},
    {"temperature": 2.0, "top_p": 0.99},
]


@pytest.fixture(params=["native", "torch"])
def candidates_op(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The candidates by the C++ op (csrc/sampling_ops.cpp, the CPU's default), or by torch's
    topk and logsumexp (CUDA's, and the CPU's without the extension)."""
    if request.param == "native":
        request.getfixturevalue("cpu_extension")
        sampler._native_ops.cache_clear()
        assert sampler._native_ops()
    else:
        monkeypatch.setattr(sampler, "_native_ops", lambda: False)
    return request.param


@pytest.mark.parametrize("candidates", [64, 4], ids=["in-candidates", "wider-and-dense"])
@pytest.mark.parametrize("case", DISTRIBUTION_CASES, ids=lambda c: ",".join(map(str, c.values())))
def test_draws_follow_the_reference_distribution(
    case: dict, candidates: int, monkeypatch: pytest.MonkeyPatch, candidates_op: str
) -> None:
    # 4 candidates: most rows need the wider set or the dense fallback, every path is drawn.
    monkeypatch.setattr(sampler, "CANDIDATES", candidates)
    monkeypatch.setattr(sampler, "WIDE_CANDIDATES", 2 * candidates)
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(7)) * 2.5
    n = 20_000
    torch.manual_seed(0)
    tokens = draw(logits.repeat(n, 1), [SamplingOptions(**case)] * n, uniforms([None] * n, [0] * n))
    observed = torch.bincount(tokens, minlength=VOCAB)
    reference = sampling_probs(logits, [SamplingOptions(**case)])[0]
    assert _chi_square_p(observed, reference) > 1e-4


def test_the_distribution_check_rejects_a_sampler_that_ignores_top_p() -> None:
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(7)) * 2.5
    n = 20_000
    torch.manual_seed(0)
    wrong = draw(logits.repeat(n, 1), [SamplingOptions(temperature=1.0)] * n, torch.rand(n))
    reference = sampling_probs(logits, [SamplingOptions(temperature=1.0, top_p=0.99)])[0]
    with pytest.raises(AssertionError, match="never draws"):
        _chi_square_p(torch.bincount(wrong, minlength=VOCAB), reference)
    wrong_t = draw(logits.repeat(n, 1), [SamplingOptions(temperature=1.2)] * n, torch.rand(n))
    reference_t = sampling_probs(logits, [SamplingOptions(temperature=1.0)])[0]
    assert _chi_square_p(torch.bincount(wrong_t, minlength=VOCAB), reference_t) < 1e-4


def test_the_caller_logits_are_not_changed(candidates_op: str) -> None:
    logits = _logits(2)
    before = logits.clone()
    options = [SamplingOptions(temperature=0.7, repetition_penalty=1.3), SamplingOptions()]
    _sample(logits, options, [[1, 2], []])
    assert torch.equal(logits, before)
    every_row_random = [  # drawn from the caller's tensor itself, no copy
        SamplingOptions(temperature=0.7, top_p=0.9, seed=1),
        SamplingOptions(temperature=1.2),
    ]
    _sample(logits, every_row_random)
    assert torch.equal(logits, before)


def test_the_native_ops_are_torchs(cpu_extension: None) -> None:
    """top_candidates against torch: the k largest logits / T (values bit for bit, best
    first), their ids, and the row's logsumexp; a tie goes to the lower token id."""
    x = torch.randn(3, 49152, generator=torch.Generator().manual_seed(3)) * 4
    t = torch.tensor([0.7, 1.0, 1.9])
    for k in (1, 5, 64, 1000):
        values, ids, lse = torch.ops.layerserve.top_candidates(x, t, k)
        scaled = x / t[:, None]
        expected = scaled.topk(k)
        assert torch.equal(values, expected.values)
        assert torch.equal(scaled.gather(1, ids), values)
        torch.testing.assert_close(lse, torch.logsumexp(scaled, dim=-1), rtol=0, atol=1e-5)
    ties = torch.tensor([[1.0, 3.0, 2.0, 3.0, 3.0, 0.5] * 4])
    _, ids, _ = torch.ops.layerserve.top_candidates(ties, torch.ones(1), 4)
    assert ids.tolist() == [[1, 3, 4, 7]]
    with pytest.raises(RuntimeError, match="k in"):
        torch.ops.layerserve.top_candidates(ties, torch.ones(1), 0)


def test_the_native_argmax_is_torchs(cpu_extension: None) -> None:
    """argmax_rows answers as torch.argmax: the first of tied maxima, a NaN before any number,
    a row of -inf its first index; any length (not only whole vectors)."""
    x = torch.randn(5, 49152, generator=torch.Generator().manual_seed(4))
    x[1, 7] = x[1, 40000] = 50.0  # a tie: the first
    x[2, 123] = float("nan")
    x[3] = float("-inf")
    x[4, 49151] = 99.0  # in the last vector
    assert torch.equal(torch.ops.layerserve.argmax_rows(x), x.argmax(dim=-1))
    odd = torch.randn(3, 37)
    odd[0, 36] = 10.0
    assert torch.equal(torch.ops.layerserve.argmax_rows(odd), odd.argmax(dim=-1))
