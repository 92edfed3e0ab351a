"""Prometheus metrics on real processes: the gateway's /metrics on its HTTP port and the
tokenizer's, scheduler's and worker's on their own metrics ports (given per process by the
launcher, so one LAYERSERVE_METRICS_PORT in the environment cannot make them collide) move as
requests go through, and together export every metric the Grafana dashboard may query: as
samples, under the names the dashboards, the autoscaler and the README use, in both formats
Prometheus negotiates, parsed as it ingests them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from layerserve.gateway.v1 import gateway_pb2
from services.stack import Stack
from tests.e2e.conftest import API_KEY, MODEL, free_ports, loopback_config, start_stack
from tests.e2e.helpers import chat_body, grpc_generate, post, stream
from tests.metric_names import autoscaler_names, dashboard_names, readme_names, sample_names
from tests.prometheus_text import OPENMETRICS, Scrape
from tests.unit.test_observability import HISTOGRAMS, SERIES

pytestmark = pytest.mark.e2e

MAX_TOKENS = 5
CLIENT_LATENCIES = (
    "layerserve:time_to_first_token_seconds",
    "layerserve:time_per_output_token_seconds",
    "layerserve:e2e_request_latency_seconds",
)


@pytest.fixture(scope="module")
def metrics_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    *metrics, shared = free_ports(4)
    log_dir = Path(tmp_path_factory.mktemp("metrics-stack"))
    config = loopback_config(
        model_name=MODEL,
        null_worker=True,
        log_dir=log_dir,
        # One port for every process, as in a container: the launcher's own flags win.
        env={"LAYERSERVE_API_KEYS": API_KEY, "LAYERSERVE_METRICS_PORT": str(shared)},
        redis="off",
        ready_timeout=180,
        metrics_ports=dict(zip(("tokenizer", "scheduler", "worker0"), metrics, strict=True)),
    )
    stack = start_stack(config)
    yield stack
    stack.stop()


def scrape_all(stack: Stack, openmetrics: bool = False) -> dict[str, Scrape]:
    """Every service's page; `openmetrics`: asked for as Prometheus does first."""
    ports = stack.config.metrics_ports
    urls = {"gateway": f"{stack.http_url}/metrics"}  # no API key needed
    urls |= {name: f"http://127.0.0.1:{ports[name]}/metrics" for name in ("tokenizer", "scheduler")}
    urls["worker"] = f"http://127.0.0.1:{ports['worker0']}/metrics"
    headers = {"Accept": OPENMETRICS} if openmetrics else {}
    kind = "application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4"
    pages = {}
    for service, url in urls.items():
        response = httpx.get(url, headers=headers, timeout=30)
        assert response.status_code == 200, (service, response.text)
        assert response.headers["content-type"].startswith(kind), service
        pages[service] = Scrape.parse(response.text, openmetrics=openmetrics)
    return pages


def test_every_service_counts_the_requests_it_served(metrics_stack: Stack):
    before = scrape_all(metrics_stack)
    usages = []
    for prompt in ("The capital of France is", "Count with me: one, two,"):
        body = {"model": MODEL, "prompt": prompt, "max_tokens": MAX_TOKENS}
        response = post(metrics_stack, "/v1/completions", body)
        assert response.status_code == 200, response.text
        usages.append(response.json()["usage"])
    body = chat_body("Hello!", max_tokens=MAX_TOKENS, stream_options={"include_usage": True})
    usages.append(stream(metrics_stack, "/v1/chat/completions", body)[-2]["usage"])
    request = gateway_pb2.GenerateRequest(model=MODEL, prompt="Once upon", max_tokens=MAX_TOKENS)
    last = grpc_generate(metrics_stack, request)[-1]
    usages.append({"prompt_tokens": last.prompt_tokens, "completion_tokens": MAX_TOKENS})
    body = {"model": MODEL, "prompt": "hi", "max_tokens": MAX_TOKENS}
    refused = post(metrics_stack, "/v1/completions", body, headers={"Authorization": "Bearer x"})
    assert refused.status_code == 401
    after = scrape_all(metrics_stack)

    requests = len(usages)
    prompt_tokens = sum(u["prompt_tokens"] for u in usages)
    completion_tokens = sum(u["completion_tokens"] for u in usages)
    assert completion_tokens == requests * MAX_TOKENS  # a null worker never stops early

    gateway = after["gateway"]
    for histogram in CLIENT_LATENCIES:
        count = gateway.delta(before["gateway"], histogram + "_count", model=MODEL)
        assert count == requests, histogram  # HTTP and gRPC alike
    errors = "layerserve:request_errors_total"
    assert gateway.delta(before["gateway"], errors, code="unauthenticated") == 1
    assert gateway.delta(before["gateway"], errors) == 1
    assert gateway.value("layerserve:requests_in_flight") == 0

    scheduler, was = after["scheduler"], before["scheduler"]
    series = {"model": MODEL, "worker": f"127.0.0.1:{metrics_stack.config.worker_ports[0]}"}
    assert scheduler.delta(was, "layerserve:prompt_tokens_total", **series) == prompt_tokens
    generated = scheduler.delta(was, "layerserve:generation_tokens_total", **series)
    assert generated == completion_tokens
    queued = scheduler.delta(was, "layerserve:request_queue_time_seconds_count", model=MODEL)
    assert queued == requests
    # Every prompt token is computed or comes from the prefix cache; every generated token
    # but the last of each request is computed in a later step.
    iteration = "layerserve:iteration_tokens_total"
    computed = scheduler.delta(was, iteration + "_sum", model=MODEL)
    hits = scheduler.delta(was, "layerserve:prefix_cache_hits_total", **series)
    assert computed + hits == prompt_tokens + completion_tokens - requests
    steps = scheduler.delta(was, iteration + "_count", model=MODEL)
    assert requests <= steps <= computed
    for gauge in ("num_requests_running", "num_requests_waiting"):
        assert scheduler.value(f"layerserve:{gauge}", **series) == 0, gauge
    assert 0 <= scheduler.value("layerserve:kv_cache_usage_perc", **series) <= 1

    tokenized = "layerserve:tokenize_time_seconds_count"
    assert after["tokenizer"].delta(before["tokenizer"], tokenized, model=MODEL) == requests
    forward = "layerserve:model_forward_time_seconds_count"
    assert after["worker"].delta(before["worker"], forward, model=MODEL) >= steps


def test_together_the_services_export_what_the_dashboard_queries(metrics_stack: Stack):
    pages = scrape_all(metrics_stack)
    types = {name: kind for page in pages.values() for name, kind in page.types.items()}
    for histogram in HISTOGRAMS:
        assert types.get(histogram) == "histogram", histogram
    derived = {h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_count", "_sum")}
    for name in SERIES - derived:
        if name.endswith("_total"):
            assert types.get(name.removesuffix("_total")) == "counter", name
        else:
            assert types.get(name) == "gauge", name


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text-0.0.4", "openmetrics"])
def test_every_name_in_use_is_a_sample_after_a_request(metrics_stack: Stack, openmetrics: bool):
    body = chat_body("Hello!", max_tokens=MAX_TOKENS)
    assert len(stream(metrics_stack, "/v1/chat/completions", body)) > 1
    pages = scrape_all(metrics_stack, openmetrics)
    names = {name for page in pages.values() for name in page.names}
    for service, page in pages.items():
        # Prometheus stores what the samples say, whatever the # TYPE line declared.
        stray = {n for n in page.names if n.startswith("layerserve_")}
        assert not stray, (service, stray)
    wanted = dashboard_names() | autoscaler_names()
    assert wanted - names == set()
    for name, kind in readme_names().items():
        assert sample_names(name, kind) <= names, name
