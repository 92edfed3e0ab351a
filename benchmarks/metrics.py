"""Serving metrics from per-request timelines (L3): TTFT, TPOT, ITL, end-to-end latency,
throughput and goodput under an SLO.

Definitions (those of vLLM's and SGLang's serving benchmarks):
- TTFT: first streamed token - request sent.
- TPOT: (last token - first token) / (output tokens - 1), per request; undefined for one token.
- ITL: every gap between two consecutive streamed chunks, all requests pooled.
- goodput: requests per second of wall time that met both TTFT <= slo_ttft and TPOT <= slo_tpot.
All times are seconds on one monotonic clock; reported latencies are milliseconds."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field


@dataclass(slots=True)
class RequestTiming:
    sent: float
    first_token: float = 0.0
    chunk_times: list[float] = field(default_factory=list)  # arrival of each token chunk
    done: float = 0.0
    completion_tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.first_token - self.sent

    @property
    def tpot(self) -> float | None:
        if self.completion_tokens < 2:
            return None
        return (self.done - self.first_token) / (self.completion_tokens - 1)

    @property
    def itls(self) -> list[float]:
        times = self.chunk_times
        return [b - a for a, b in zip(times, times[1:], strict=False)]


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float
    tpot_s: float

    def met_by(self, timing: RequestTiming) -> bool:
        tpot = timing.tpot
        return timing.ttft <= self.ttft_s and (tpot is None or tpot <= self.tpot_s)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in 0..100, got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_ms(values: list[float]) -> dict[str, float]:
    """Mean, p50 and p99 in milliseconds of `values` in seconds; zeros when there are none."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    return {
        "mean": 1000 * statistics.fmean(values),
        "p50": 1000 * percentile(values, 50),
        "p99": 1000 * percentile(values, 99),
    }


def summarize(timings: list[RequestTiming], wall: float, slo: Slo | None = None) -> dict:
    """One sweep point: throughput over `wall` seconds and latency distributions."""
    if wall <= 0:
        raise ValueError(f"wall time must be positive, got {wall}")
    tokens = sum(t.completion_tokens for t in timings)
    tpots = [t.tpot for t in timings if t.tpot is not None]
    summary = {
        "requests": len(timings),
        "output_tokens": tokens,
        "wall_s": wall,
        "output_tok_s": tokens / wall,
        "requests_s": len(timings) / wall,
        "ttft_ms": latency_ms([t.ttft for t in timings]),
        "tpot_ms": latency_ms(tpots),
        "itl_ms": latency_ms([gap for t in timings for gap in t.itls]),
        "e2e_ms": latency_ms([t.done - t.sent for t in timings]),
    }
    if slo is not None:
        met = sum(slo.met_by(t) for t in timings)
        summary["slo"] = {"ttft_ms": 1000 * slo.ttft_s, "tpot_ms": 1000 * slo.tpot_s}
        summary["slo_attained"] = met / len(timings) if timings else 0.0
        summary["goodput_requests_s"] = met / wall
    return summary
