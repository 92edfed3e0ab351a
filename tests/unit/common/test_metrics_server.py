"""The metrics server of the tokenizer, scheduler and worker: off at port 0, plain HTTP without
TLS, and under mutual TLS only for a scraper that presents a certificate of the CA. In both
formats Prometheus negotiates, every sample carries its family's `layerserve:` name."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram

from services.common.metrics import serve_metrics
from services.common.metrics_page import render
from services.common.tls import TlsSettings
from services.worker.serving.step_metrics import MODEL_FORWARD_TIME
from tests.e2e.conftest import free_ports
from tests.prometheus_text import OPENMETRICS, Scrape
from tests.tls_certs import TestCA


@pytest.fixture
def servers() -> Iterator[list]:
    started: list = []
    yield started
    for server in started:
        server.shutdown()
        server.server_close()


def test_port_0_serves_nothing() -> None:
    assert serve_metrics(0, "127.0.0.1", TlsSettings()) is None


def test_serves_the_process_metrics_in_the_prometheus_text_format(servers: list) -> None:
    (port,) = free_ports(1)
    servers.append(serve_metrics(port, "127.0.0.1", TlsSettings()))
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert response.status_code == 200
    page = Scrape.parse(response.text)
    assert page.types["layerserve:model_forward_time_seconds"] == "histogram"
    assert httpx.get(f"http://127.0.0.1:{port}/", timeout=10).status_code == 404


# What Prometheus 2.42 sends.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)


@pytest.mark.parametrize("accept", [PROMETHEUS_ACCEPT, OPENMETRICS, "text/plain", None])
def test_samples_carry_the_family_name_in_either_format(servers: list, accept) -> None:
    MODEL_FORWARD_TIME.labels("m").observe(0.01)
    (port,) = free_ports(1)
    servers.append(serve_metrics(port, "127.0.0.1", TlsSettings()))
    headers = {"Accept": accept} if accept else {}
    response = httpx.get(f"http://127.0.0.1:{port}/metrics", headers=headers, timeout=10)
    openmetrics = accept is not None and accept.startswith("application/openmetrics-text")
    kind = "application/openmetrics-text" if openmetrics else "text/plain; version=0.0.4"
    assert response.headers["content-type"].startswith(kind)
    page = Scrape.parse(response.text, openmetrics=openmetrics)
    name = "layerserve:model_forward_time_seconds"
    assert page.types[name] == "histogram"
    assert {name + "_count", name + "_sum", name + "_bucket"} <= page.names
    assert not any(n.startswith("layerserve_") for n in page.names)


def test_under_mutual_tls_only_a_scraper_with_a_certificate_gets_in(
    servers: list, tmp_path: Path
) -> None:
    ca = TestCA(tmp_path)
    leaf = ca.issue("service")
    tls = TlsSettings(cert=leaf.cert, key=leaf.key, ca=ca.path, client_auth=True)
    (port,) = free_ports(1)
    servers.append(serve_metrics(port, "127.0.0.1", tls))
    url = f"https://127.0.0.1:{port}/metrics"
    anonymous = ssl.create_default_context(cafile=ca.path)
    with pytest.raises(httpx.HTTPError):
        httpx.get(url, verify=anonymous, timeout=10).raise_for_status()
    with pytest.raises(httpx.HTTPError):  # and plaintext is refused too
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).raise_for_status()
    known = ssl.create_default_context(cafile=ca.path)
    known.load_cert_chain(leaf.cert, leaf.key)
    response = httpx.get(url, verify=known, timeout=10)
    assert response.status_code == 200 and "layerserve:" in response.text


def test_a_signed_histogram_is_valid_openmetrics() -> None:
    """Negative buckets: no _sum, so (OpenMetrics) no _count either, and the page parses."""
    registry = CollectorRegistry()
    signed = Histogram(
        "layerserve:error_tokens", "d", ["model"], buckets=(-8, 0, 8), registry=registry
    )
    signed.labels("m").observe(-3)
    page, _ = render(OPENMETRICS, registry)
    scrape = Scrape.parse(page.decode(), openmetrics=True)
    assert scrape.value("layerserve:error_tokens_bucket", le="0.0") == 1
    assert "layerserve:error_tokens_count" not in scrape.names
    text = Scrape.parse(render(None, registry)[0].decode())
    assert text.value("layerserve:error_tokens_count") == 1  # the text format keeps it
