"""Serving metrics on hand-made request timelines (seconds), checked against arithmetic."""

from __future__ import annotations

import pytest

from benchmarks.metrics import RequestTiming, Slo, latency_ms, percentile, summarize


def timing(sent: float, chunks: list[float], tokens: int | None = None) -> RequestTiming:
    """A request sent at `sent` whose tokens streamed at `chunks`, done at the last one."""
    return RequestTiming(
        sent=sent,
        first_token=chunks[0],
        chunk_times=list(chunks),
        done=chunks[-1],
        completion_tokens=len(chunks) if tokens is None else tokens,
    )


def test_ttft_tpot_and_itl_of_one_request() -> None:
    t = timing(1.0, [1.5, 1.6, 1.8, 2.1])
    assert t.ttft == pytest.approx(0.5)
    assert t.tpot == pytest.approx((2.1 - 1.5) / 3)
    assert t.itls == pytest.approx([0.1, 0.2, 0.3])


def test_tpot_is_undefined_for_a_single_token() -> None:
    assert timing(0.0, [0.4]).tpot is None


def test_percentiles_interpolate_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 100) == 4.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_latency_ms_reports_mean_p50_p99_in_milliseconds() -> None:
    stats = latency_ms([0.1, 0.2, 0.3, 1.0])
    assert stats["mean"] == pytest.approx(400.0)
    assert stats["p50"] == pytest.approx(250.0)
    assert stats["p99"] == pytest.approx(1000 * (0.3 + 0.97 * 0.7))
    assert latency_ms([]) == {"mean": 0.0, "p50": 0.0, "p99": 0.0}


def test_summary_of_two_requests() -> None:
    fast = timing(0.0, [0.2, 0.3, 0.4, 0.5])  # TTFT 0.2, TPOT 0.1
    slow = timing(0.0, [1.0, 1.5, 2.0])  # TTFT 1.0, TPOT 0.5
    s = summarize([fast, slow], wall=2.0)
    assert s["requests"] == 2 and s["output_tokens"] == 7
    assert s["output_tok_s"] == pytest.approx(3.5)
    assert s["requests_s"] == pytest.approx(1.0)
    assert s["ttft_ms"]["mean"] == pytest.approx(600.0)
    assert s["tpot_ms"]["p50"] == pytest.approx(300.0)
    assert s["itl_ms"]["mean"] == pytest.approx(1000 * (0.3 + 1.0) / 5)  # 5 gaps in all
    assert s["e2e_ms"]["p99"] == pytest.approx(1000 * (0.5 + 0.99 * 1.5))
    assert "goodput_requests_s" not in s


def test_goodput_counts_only_requests_within_both_slos() -> None:
    fast = timing(0.0, [0.2, 0.3, 0.4])  # TTFT 0.2, TPOT 0.1: meets both
    late_start = timing(0.0, [2.0, 2.1, 2.2])  # TTFT 2.0: misses TTFT
    slow_stream = timing(0.0, [0.3, 1.3, 2.3])  # TPOT 1.0: misses TPOT
    one_token = timing(0.0, [0.5])  # no TPOT: judged on TTFT alone
    s = summarize([fast, late_start, slow_stream, one_token], wall=4.0, slo=Slo(1.0, 0.5))
    assert s["slo_attained"] == pytest.approx(0.5)
    assert s["goodput_requests_s"] == pytest.approx(2 / 4.0)
    assert s["slo"] == {"ttft_ms": 1000.0, "tpot_ms": 500.0}


def test_a_run_needs_a_positive_wall_time() -> None:
    with pytest.raises(ValueError, match="wall"):
        summarize([], wall=0.0)
