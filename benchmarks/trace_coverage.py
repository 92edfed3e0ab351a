"""How much of each request's end-to-end time its trace explains, under load: a null-worker
stack traces to an OTLP/gRPC receiver in this process while --concurrency streams run chat
completions; for every request, the share of its gateway span's time covered by the union of
its trace's leaf spans (spans with no child in the trace), and the gaps no leaf covers, by the
spans around them.

    PYTHONPATH=. python -m benchmarks.trace_coverage [--concurrency 64] [--requests 128]
        [--tokens 16] [--null-worker]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from tests.e2e.conftest import free_ports, loopback_config, start_stack
from tests.e2e.otlp_collector import ReceivedSpan, running_collector

KEY = "coverage-key"
MODEL = "smollm2-135m-instruct"
ROOT = "POST /v1/chat/completions"


def coverage(trace: list[ReceivedSpan]) -> tuple[float, list[tuple[int, str, str]]]:
    """(share of the root's time under a leaf, the uncovered gaps as (ns, leaf before, leaf
    after))."""
    root = next(s for s in trace if s.name == ROOT)
    parents = {s.parent_id for s in trace}
    leaves = sorted(
        (max(s.start_ns, root.start_ns), min(s.end_ns, root.end_ns), s.name)
        for s in trace
        if s.span_id not in parents and s is not root
    )
    covered, cursor, before, gaps = 0, root.start_ns, "(start)", []
    for start, end, name in leaves:
        if start > cursor:
            gaps.append((start - cursor, before, name))
        if end > cursor:
            covered += end - max(start, cursor)
            cursor, before = end, name
    if root.end_ns > cursor:
        gaps.append((root.end_ns - cursor, before, "(end)"))
    return covered / max(1, root.end_ns - root.start_ns), gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--requests", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument(
        "--null-worker", action="store_true", help="a worker that samples without a model"
    )
    a = parser.parse_args()
    (otlp,) = free_ports(1)
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_SERVICE_NAME": "",
        "LAYERSERVE_API_KEYS": KEY,
    }
    log_dir = Path(tempfile.mkdtemp(prefix="trace-coverage-"))
    config = loopback_config(
        model_name=MODEL, null_worker=a.null_worker, log_dir=log_dir, env=env, redis="off"
    )
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "max_tokens": a.tokens,
        "stream": True,
    }
    with running_collector(otlp) as collector:
        stack = start_stack(config)
        try:
            with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=a.concurrency)) as c:

                def send(_: int) -> None:
                    headers = {"Authorization": f"Bearer {KEY}"}
                    url = f"{stack.http_url}/v1/chat/completions"
                    with c.stream("POST", url, json=body, headers=headers) as response:
                        assert response.status_code == 200
                        for _ in response.iter_lines():
                            pass

                started = time.monotonic()
                with ThreadPoolExecutor(a.concurrency) as pool:
                    list(pool.map(send, range(a.requests)))
                elapsed = time.monotonic() - started
            time.sleep(2)  # the last exports
            spans = collector.spans
        finally:
            stack.stop()
    by_trace: dict[str, list[ReceivedSpan]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    traces = [t for t in by_trace.values() if any(s.name == ROOT for s in t)]
    results = [coverage(t) for t in traces]
    shares = sorted(share for share, _ in results)
    gaps: Counter[tuple[str, str]] = Counter()
    for _, request_gaps in results:
        for ns, before, after in request_gaps:
            gaps[(before, after)] += ns
    total = sum(gaps.values())
    worker = "a null worker" if a.null_worker else MODEL
    print(f"{len(traces)} traced requests of {a.requests}, {a.concurrency} streams, {worker}")
    print(f"  {a.tokens} tokens each, {elapsed:.1f} s")
    print(
        f"leaf coverage of the end-to-end time: min {shares[0]:.1%}, "
        f"p5 {shares[len(shares) // 20]:.1%}, median {statistics.median(shares):.1%}, "
        f"mean {statistics.fmean(shares):.1%}"
    )
    print("uncovered time by the leaves around it (share of all uncovered time):")
    for (before, after), ns in gaps.most_common(8):
        print(f"  {before} -> {after}: {ns / 1e6 / len(traces):.2f} ms a request, {ns / total:.0%}")


if __name__ == "__main__":
    main()
