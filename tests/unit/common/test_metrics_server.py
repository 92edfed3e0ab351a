"""The metrics server of the tokenizer, scheduler and worker: off at port 0, plain HTTP without
TLS, and under mutual TLS only for a scraper that presents a certificate of the CA."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import services.worker.step_metrics  # noqa: F401 (a layerserve metric to find on the page)
from services.common.metrics import serve_metrics
from services.common.tls import TlsSettings
from tests.e2e.conftest import free_ports
from tests.prometheus_text import Scrape
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
