"""Prometheus metrics: names follow vLLM's where one exists, under the prefix `layerserve:`.

The gateway serves `/metrics` on its HTTP port; the tokenizer, scheduler and worker on
`--metrics-port` (LAYERSERVE_METRICS_PORT; no server when 0 or unset), bound to the service's
own --host and with its TLS settings. Each process defines only the metrics it observes, in
one module of its own (gateway/request_metrics.py, scheduler/scheduler_metrics.py,
tokenizer/tokenize_metrics.py, worker/serving/step_metrics.py).
"""

from __future__ import annotations

import logging
from wsgiref.simple_server import WSGIServer

from prometheus_client import Counter, Gauge, Histogram

from services.common.metrics_page import start_server
from services.common.tls import TlsSettings

log = logging.getLogger(__name__)

PREFIX = "layerserve:"

# Bucket bounds. Latencies in seconds: fine at the low end (a null worker answers in
# milliseconds), up to minutes for long outputs on a CPU. vLLM's where they fit.
# fmt: off
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                   5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0)
TOKEN_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                         0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
                   20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
                2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
# fmt: on


def histogram(
    name: str, doc: str, buckets: tuple[float, ...], labels: tuple[str, ...] = ()
) -> Histogram:
    return Histogram(PREFIX + name, doc, labels, buckets=buckets)


def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
    # prometheus_client appends _total itself; the name given here goes without it.
    return Counter(PREFIX + name.removesuffix("_total"), doc, labels)


def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
    return Gauge(PREFIX + name, doc, labels)


def check_metrics_port(port: int) -> None:
    if not 0 <= port <= 65535:
        raise ValueError(f"--metrics-port must be 0 (off) or a TCP port, got {port}")


def serve_metrics(port: int, host: str, tls: TlsSettings) -> WSGIServer | None:
    """Serves /metrics from a thread of its own (metrics_page.py), if port > 0: TLS when the
    process serves TLS, asking for a client certificate under mutual TLS, as the service's
    gRPC port does. A port already taken fails the start-up. Returns the server (it stops with
    the process), None for port 0."""
    if port <= 0:
        return None
    tls.require_serving()
    server = start_server(port, host, tls)
    scheme = "https" if tls.cert else "http"
    log.info("metrics at %s://%s:%d/metrics", scheme, host, port)
    return server
