"""The observability configs of docker-compose.yml (observability/): Prometheus scrapes every
service where it serves /metrics, Grafana finds its data sources and dashboard where compose
mounts them, and the dashboard queries only metrics that layerserve exports, each the way its
type allows (a histogram through _bucket, _count or _sum)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.metric_names import autoscaler_names, dashboard_names, readme_names, sample_names
from tests.unit.compose_files import GPU_FILES, LAYERSERVE_SERVICES, REPO, resolve, service_config

OBSERVABILITY = REPO / "observability"
DASHBOARD = OBSERVABILITY / "grafana" / "dashboards" / "layerserve.json"

# What the services export (vLLM-style names): README "docker compose".
HISTOGRAMS = {
    "layerserve:time_to_first_token_seconds",
    "layerserve:time_per_output_token_seconds",
    "layerserve:e2e_request_latency_seconds",
    "layerserve:inter_token_latency_seconds",
    "layerserve:request_queue_time_seconds",
    "layerserve:iteration_tokens_total",
}
SERIES = {
    "layerserve:num_requests_running",
    "layerserve:num_requests_waiting",
    "layerserve:kv_cache_usage_perc",
    "layerserve:prefix_cache_queries_total",
    "layerserve:prefix_cache_hits_total",
    "layerserve:num_preemptions_total",
    "layerserve:prompt_tokens_total",
    "layerserve:generation_tokens_total",
    "layerserve:rate_limit_rejections_total",
    "layerserve:request_errors_total",
} | {h + suffix for h in HISTOGRAMS for suffix in ("_bucket", "_count", "_sum")}
# Every other word a dashboard query may hold: PromQL functions, keywords and label names.
PROMQL_WORDS = {"histogram_quantile", "sum", "avg", "max", "min", "rate", "by", "le", "code"}


@pytest.fixture(scope="module")
def compose(tmp_path_factory) -> dict:
    return resolve(tmp_path_factory.mktemp("compose"), GPU_FILES)


def _mounts(compose: dict, service: str) -> dict[str, Path]:
    """Container path -> host path of the service's bind mounts."""
    volumes = compose["services"][service].get("volumes", [])
    return {v["target"]: Path(v["source"]) for v in volumes if v["type"] == "bind"}


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_prometheus_scrapes_every_service_where_it_serves_metrics(compose) -> None:
    mounts = _mounts(compose, "prometheus")
    config = _yaml(mounts["/etc/prometheus/prometheus.yml"])
    targets = {
        job["job_name"]: [t for group in job["static_configs"] for t in group["targets"]]
        for job in config["scrape_configs"]
    }
    expected = {"gateway": [f"gateway:{service_config(compose, 'gateway').http_port}"]}
    for name in ("tokenizer", "scheduler", "worker"):
        config = service_config(compose, name)  # its metrics server is on, on every interface
        assert config.metrics_port > 0 and config.host == "0.0.0.0", name
        expected[name] = [f"{name}:{config.metrics_port}"]
    embedding = service_config(compose, "worker-embedding", "worker")  # issue 30's encoder
    expected["worker"].append(f"worker-embedding:{embedding.metrics_port}")
    assert targets == expected
    assert set(targets) == set(LAYERSERVE_SERVICES)


def test_grafana_is_provisioned_with_prometheus_jaeger_and_the_dashboard(compose) -> None:
    mounts = _mounts(compose, "grafana")
    provisioning = mounts["/etc/grafana/provisioning"]
    sources = {
        s["type"]: s
        for path in sorted((provisioning / "datasources").glob("*.yml"))
        for s in _yaml(path)["datasources"]
    }
    assert set(sources) == {"prometheus", "jaeger"}
    # Each URL names a compose service and the port it listens on in the network.
    assert sources["prometheus"]["url"] == "http://prometheus:9090"
    assert sources["jaeger"]["url"] == "http://jaeger:16686"
    assert {"prometheus", "jaeger"} <= set(compose["services"])
    providers = [
        p
        for path in sorted((provisioning / "dashboards").glob("*.yml"))
        for p in _yaml(path)["providers"]
    ]
    folders = {p["options"]["path"] for p in providers}
    assert any((mounts[f] / DASHBOARD.name).samefile(DASHBOARD) for f in folders if f in mounts)
    home = compose["services"]["grafana"]["environment"][
        "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"
    ]
    assert Path(home).parent.as_posix() in folders and Path(home).name == DASHBOARD.name
    # The dashboard asks for a data source that exists.
    uids = {s["uid"] for s in sources.values()}
    assert {t["datasource"]["uid"] for t in _targets()} <= uids
    # An exemplar's trace_id opens its trace in Jaeger.
    links = sources["prometheus"]["jsonData"]["exemplarTraceIdDestinations"]
    assert links == [{"name": "trace_id", "datasourceUid": sources["jaeger"]["uid"]}]
    # and Prometheus keeps exemplars.
    assert "--enable-feature=exemplar-storage" in compose["services"]["prometheus"]["command"]


def test_dashboard_queries_only_exported_metrics_each_as_its_type_allows() -> None:
    for target in _targets():
        expr = target["expr"]
        assert expr.count("(") == expr.count(")"), expr
        words = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", re.sub(r"\$\w+", "", expr)))
        metrics = {w for w in words if ":" in w}
        assert metrics, f"no layerserve metric in {expr!r}"
        assert metrics <= SERIES, f"unknown metric in {expr!r}: {metrics - SERIES}"
        assert words - metrics <= PROMQL_WORDS, f"unexpected word in {expr!r}"


def test_dashboard_shows_latency_throughput_cache_and_queues() -> None:
    used = {m for t in _targets() for m in re.findall(r"layerserve:[A-Za-z0-9_:]+", t["expr"])}
    for histogram in (
        "layerserve:time_to_first_token_seconds",
        "layerserve:time_per_output_token_seconds",
        "layerserve:e2e_request_latency_seconds",
        "layerserve:inter_token_latency_seconds",
    ):
        assert histogram + "_bucket" in used, histogram  # its p50 and p95
    assert {
        "layerserve:generation_tokens_total",
        "layerserve:kv_cache_usage_perc",
        "layerserve:prefix_cache_hits_total",
        "layerserve:prefix_cache_queries_total",
        "layerserve:num_requests_running",
        "layerserve:num_requests_waiting",
    } <= used


def test_the_readme_lists_every_metric_the_dashboard_and_the_autoscaler_use() -> None:
    listed = readme_names()
    documented = {n for name, kind in listed.items() for n in sample_names(name, kind)}
    documented |= {
        name + suffix
        for name, kind in listed.items()
        if kind == "histogram"
        for suffix in ("_count", "_sum")
    }
    assert dashboard_names() | autoscaler_names() <= documented
    assert autoscaler_names() == {"layerserve:num_requests_waiting"}
    assert set(listed) >= {n.removesuffix("_bucket") for n in HISTOGRAMS}


def _targets() -> list[dict]:
    dashboard = json.loads(DASHBOARD.read_text())
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p.get("targets") for p in panels)
    return [t for p in panels for t in p["targets"]]
