"""The dashboards as an operator sees them: a real Prometheus (Debian's `prometheus` package;
.ci/run installs it) scrapes a live null-worker stack every second, in the format it
negotiates (OpenMetrics), while streamed chat requests go through; then every query of every
Grafana dashboard, evaluated through Prometheus' HTTP API, returns data, and the latency
histograms hold exemplars naming the requests' traces (the stack traces to an OTLP receiver in
this process), which Grafana links to Jaeger.

Skipped, saying so, where no `prometheus` binary is on PATH (README "Metrics" says how to run
it elsewhere)."""

from __future__ import annotations

import math
import shutil
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack
from tests.e2e.helpers import chat_body, stream
from tests.e2e.otlp_collector import Collector, running_collector
from tests.metric_names import Query, dashboard_queries

PROMETHEUS = shutil.which("prometheus")
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        PROMETHEUS is None,
        reason="no prometheus binary on PATH (apt-get install prometheus; .ci/run does)",
    ),
]

REQUESTS = 12
CONCURRENCY = 4
RATE_INTERVAL = "30s"  # Grafana's $__rate_interval, wide enough for a busy machine
# Queries that may return nothing until their event happens. The gateway creates every label
# value of its error and rate-limit counters at start-up, and the scheduler reports its
# preemptions counter per worker, so even those panels show 0 rather than no data: none here.
EMPTY_UNTIL_EVENT: dict[str, str] = {}
# Latency histograms observed with the trace id of a traced request (request_metrics.py).
EXEMPLARS = (
    "layerserve:time_to_first_token_seconds_bucket",
    "layerserve:inter_token_latency_seconds_bucket",
    "layerserve:e2e_request_latency_seconds_bucket",
)


@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Collector]]:
    otlp, *metrics = free_ports(4)
    env = {
        "LAYERSERVE_API_KEYS": API_KEY,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{otlp}",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        "OTEL_SERVICE_NAME": "",  # each service names itself
    }
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        log_dir=Path(tmp_path_factory.mktemp("prometheus-stack")),
        env=env,
        redis="off",
        metrics_ports=dict(zip(("tokenizer", "scheduler", "worker0"), metrics, strict=True)),
    )
    with running_collector(otlp) as collector:
        stack = start_stack(config)
        try:
            yield stack, collector
        finally:
            stack.stop()


@pytest.fixture(scope="module")
def prometheus(traced_stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus scraping the stack every second; yields its base URL."""
    stack, _ = traced_stack
    ports = stack.config.metrics_ports
    targets = {
        "gateway": f"127.0.0.1:{stack.config.http_port}",
        "tokenizer": f"127.0.0.1:{ports['tokenizer']}",
        "scheduler": f"127.0.0.1:{ports['scheduler']}",
        "worker": f"127.0.0.1:{ports['worker0']}",
    }
    workdir = Path(tmp_path_factory.mktemp("prometheus"))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [target]}]}
            for job, target in targets.items()
        ],
    }
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    log = (workdir / "prometheus.log").open("w")
    process = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until(lambda: _all_up(url, len(targets)), 30, "every target up", workdir)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _wait_until(check, seconds: float, what: str, workdir: Path | None = None) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            tail = (workdir / "prometheus.log").read_text()[-3000:] if workdir else ""
            raise AssertionError(f"not within {seconds} s: {what}\n{tail}")
        time.sleep(0.5)


def _all_up(url: str, count: int) -> bool:
    try:
        response = httpx.get(f"{url}/api/v1/targets", timeout=5)
    except httpx.HTTPError:
        return False
    if response.status_code != 200:
        return False
    active = response.json()["data"]["activeTargets"]
    return len(active) == count and all(t["health"] == "up" for t in active)


def _api(url: str, path: str, **params: str) -> dict | list:
    response = httpx.get(f"{url}/api/v1/{path}", params=params, timeout=10)
    body = response.json()
    assert response.status_code == 200 and body["status"] == "success", body
    return body["data"]


def _values(url: str, query: Query) -> list[float]:
    """One value per series the query returns now (NaN where, say, a quantile has no data)."""
    result = _api(url, "query", query=query.promql(RATE_INTERVAL))["result"]
    return [float(series["value"][1]) for series in result]


def _send_traffic(stack: Stack) -> None:
    """One request, then (once Prometheus has scraped the series it created at 0) a dozen: a
    series' first scrape is its start, so rate() sees only what comes after it."""
    body = chat_body("Tell me about the sea.", max_tokens=8, stream_options={"include_usage": True})
    send = lambda _: stream(stack, "/v1/chat/completions", body)  # noqa: E731
    assert send(0)[-1] == "[DONE]"
    time.sleep(2.5)
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(send, range(REQUESTS)))
    assert all(answer[-1] == "[DONE]" for answer in answers)


def test_every_dashboard_query_returns_data_after_traffic(traced_stack, prometheus: str):
    stack, collector = traced_stack
    _send_traffic(stack)
    queries = dashboard_queries()
    assert queries

    def missing() -> list[Query]:
        return [
            q
            for q in queries
            if q.expr not in EMPTY_UNTIL_EVENT
            and not any(math.isfinite(v) for v in _values(prometheus, q))
        ]

    # Scrapes land every second; give a busy machine a few of them.
    deadline = time.monotonic() + 20
    while (empty := missing()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not empty, "queries without data:\n" + "\n".join(map(str, empty))

    # A p99 links to its trace: exemplars carry the trace ids of the requests just sent.
    traced = {s.trace_id for s in collector.spans if s.name == "POST /v1/chat/completions"}
    assert traced
    now = time.time()
    for series in EXEMPLARS:
        found = _api(
            prometheus, "query_exemplars", query=series, start=str(now - 300), end=str(now)
        )
        trace_ids = {e["labels"]["trace_id"] for s in found for e in s["exemplars"]}
        assert trace_ids and trace_ids <= traced, series
