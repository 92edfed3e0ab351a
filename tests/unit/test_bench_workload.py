"""The benchmark workloads and arrival times: seeded, of the sizes the Scale states."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.arrivals import poisson_arrivals
from benchmarks.sampling import GREEDY, SAMPLED, request_seeds
from benchmarks.scales import SCALES, scale_named
from benchmarks.service import request_body
from benchmarks.workload import VOCAB, WORKLOADS, build_workload, in_flight

SMALL = SCALES["small"]


@pytest.mark.parametrize("name", WORKLOADS)
def test_same_seed_same_workload_other_seed_other_prompts(name: str) -> None:
    first = build_workload(name, SMALL, seed=3)
    assert build_workload(name, SMALL, seed=3) == first
    assert build_workload(name, SMALL, seed=4) != first
    counts = {"long-context": SMALL.long_streams, "single-stream": SMALL.single_requests}
    assert len(first) == counts.get(name, SMALL.requests)
    assert all(VOCAB[0] <= t <= VOCAB[1] for item in first for t in item.prompt_ids)


@pytest.mark.parametrize("name", WORKLOADS)
def test_a_variant_keeps_the_lengths_and_changes_the_tokens(name: str) -> None:
    base = build_workload(name, SMALL, seed=0, variant=0)
    other = build_workload(name, SMALL, seed=0, variant=1)
    assert [(len(i.prompt_ids), i.output_len) for i in base] == [
        (len(i.prompt_ids), i.output_len) for i in other
    ]
    assert [i.prompt_ids for i in base] != [i.prompt_ids for i in other]


def test_mixed_lengths_are_spread_over_their_ranges() -> None:
    items = build_workload("mixed", SCALES["full"], seed=0)
    inputs = [len(i.prompt_ids) for i in items]
    outputs = [i.output_len for i in items]
    assert len(items) == 256
    assert min(inputs) >= 100 and max(inputs) <= 1024 and len(set(inputs)) > 100
    assert min(outputs) >= 100 and max(outputs) <= 1024 and len(set(outputs)) > 100


@pytest.mark.parametrize(
    ("name", "shape"),
    [("fixed", (1024, 128)), ("prefill-heavy", (460, 16)), ("decode-heavy", (460, 256))],
)
def test_fixed_shape_workloads_have_the_stated_lengths(name: str, shape: tuple) -> None:
    items = build_workload(name, SCALES["full"], seed=0)
    assert {(len(i.prompt_ids), i.output_len) for i in items} == {shape}
    assert len({tuple(i.prompt_ids) for i in items}) == len(items)  # no accidental sharing


@pytest.mark.parametrize("scale", ["small", "full"])
def test_single_stream_is_one_128_token_prompt_at_a_time_for_256_tokens(scale: str) -> None:
    items = build_workload("single-stream", SCALES[scale], seed=0)
    assert {(len(i.prompt_ids), i.output_len) for i in items} == {(128, 256)}
    assert in_flight("single-stream", SCALES[scale]) == 1
    assert in_flight("mixed", SCALES[scale]) == SCALES[scale].max_num_seqs


@pytest.mark.parametrize("streams", [16, 64])
def test_small_has_16_and_64_stream_variants_all_in_flight(streams: int) -> None:
    scale = scale_named(f"small-{streams}")
    items = build_workload("mixed", scale, seed=0)
    assert len(items) == streams == scale.max_num_seqs == in_flight("mixed", scale)
    assert scale.concurrency == (streams,)
    # minutes on two cores: short prompts and outputs (prefill ~450 tok/s in float32 there)
    assert sum(len(i.prompt_ids) for i in items) <= 128 * streams
    assert max(i.output_len for i in items) <= 48


def test_shared_prefix_prompts_share_exactly_the_prefix() -> None:
    items = build_workload("shared-prefix", SMALL, seed=0)
    prefix = items[0].prompt_ids[: SMALL.prefix_len]
    for item in items:
        assert item.prompt_ids[: SMALL.prefix_len] == prefix
        own = len(item.prompt_ids) - SMALL.prefix_len
        assert SMALL.prefix_suffix[0] <= own <= SMALL.prefix_suffix[1]
        assert item.output_len == SMALL.prefix_out
    # The token right after the prefix differs somewhere: the prompts are not all one prompt.
    assert len({item.prompt_ids[SMALL.prefix_len] for item in items}) > 1


def test_unknown_names_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload"):
        build_workload("chatty", SMALL, seed=0)
    with pytest.raises(ValueError, match="unknown scale"):
        scale_named("huge")


def test_poisson_arrivals_have_the_asked_mean_rate() -> None:
    times = poisson_arrivals(rate=4.0, count=4001, seed=1)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert times[0] == 0.0 and min(gaps) >= 0
    assert statistics.fmean(gaps) == pytest.approx(0.25, rel=0.06)
    # Exponential gaps: the standard deviation equals the mean (a fixed pace would give 0).
    assert statistics.pstdev(gaps) == pytest.approx(0.25, rel=0.1)
    assert poisson_arrivals(4.0, 50, seed=1) == times[:50]
    assert poisson_arrivals(4.0, 50, seed=2) != times[:50]


def test_poisson_arrivals_refuse_a_rate_of_zero() -> None:
    with pytest.raises(ValueError, match="positive"):
        poisson_arrivals(0.0, 10, seed=0)


@pytest.mark.parametrize("scale", ["tiny", "small", "full"])
def test_long_context_is_the_scales_streams_of_long_prompts(scale: str) -> None:
    s = SCALES[scale]
    items = build_workload("long-context", s, seed=0)
    assert len(items) == s.long_streams <= s.max_num_seqs  # every stream in flight at once
    assert all(s.long_in[0] <= len(i.prompt_ids) <= s.long_in[1] for i in items)
    assert {i.output_len for i in items} == {s.long_out}


def test_long_context_at_full_scale_is_64_streams_of_1_to_2k_tokens() -> None:
    items = build_workload("long-context", SCALES["full"], seed=0)
    lengths = [len(i.prompt_ids) for i in items]
    assert len(items) == 64 and min(lengths) >= 1024 and max(lengths) <= 2048
    assert len(set(lengths)) > 32  # spread over the range, not one length


def test_each_request_gets_its_own_seed_the_same_on_every_side() -> None:
    seeds = request_seeds(0, 64)
    assert request_seeds(0, 64) == seeds and request_seeds(1, 64) != seeds
    assert len(set(seeds)) == 64 and all(0 <= s < 2**31 for s in seeds)  # llama.cpp: uint32
    options = SAMPLED.options(seeds[:3])
    assert [(o.temperature, o.top_p, o.seed) for o in options] == [
        (0.7, 0.95, s) for s in seeds[:3]
    ]
    assert all(o.temperature == 0 and o.seed is None for o in GREEDY.options(seeds[:3]))


def test_gateway_requests_carry_the_sampling_and_a_seed() -> None:
    item = build_workload("mixed", SCALES["tiny"], seed=0)[0]
    sampled = request_body("m", item, SAMPLED, seed=7)
    assert (sampled["temperature"], sampled["top_p"], sampled["seed"]) == (0.7, 0.95, 7)
    assert sampled["prompt"] == item.prompt_ids and sampled["max_tokens"] == item.output_len
    assert sampled["ignore_eos"] and sampled["stream"]
    greedy = request_body("m", item, GREEDY, seed=7)
    assert greedy["temperature"] == 0 and "seed" not in greedy


def test_l3_sends_single_stream_one_request_at_a_time() -> None:
    from benchmarks.l3_service import L3Plan
    from benchmarks.metrics import Slo

    plan = L3Plan(
        SMALL, 0, ("single-stream", "mixed"), concurrency=(1, 8), rates=(1.0,),
        slo=Slo(3.0, 0.3), repeats=2,
    )  # fmt: skip
    assert plan.points("single-stream") == [("concurrency 1", 1, None)]
    assert [c for _, c, _ in plan.points("mixed")] == [1, 8, None]
    assert plan.runs() == (1 + 3) * 2  # one greedy pass: 1 + 3 points, 2 repeats each
