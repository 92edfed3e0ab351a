"""The /metrics page, in the format the scraper asks for, and the small HTTP server the
tokenizer, scheduler and worker serve it from (the gateway serves the same page on its own HTTP
port: gateway/request_metrics.py).

Prometheus asks for OpenMetrics first. prometheus_client's OpenMetrics writer, with its default
escaping (`underscores`), checks sample names by the rules for label names, which allow no ':',
and so writes `layerserve_num_requests_running` under `# TYPE layerserve:num_requests_running`:
Prometheus stores the sample names, and every query for `layerserve:...` finds nothing. With
`allow-utf-8` it writes every name that is valid in the classic format
(`[a-zA-Z_:][a-zA-Z0-9_:]*`, as all of ours are) as it is. The text format (0.0.4) writes them as
they are either way.

prometheus_client also writes a histogram with negative buckets (a signed quantity, such as the
scheduler's prefix_cache_prediction_error_tokens) with a `_count` but no `_sum`, which
OpenMetrics forbids (`_count` if and only if `_sum`) and its own parser refuses, with the whole
page; in OpenMetrics such a histogram goes without `_count` (its +Inf bucket says the same).
"""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, ThreadingWSGIServer
from prometheus_client.exposition import generate_latest as text_page
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from services.common.tls import TlsSettings

OPENMETRICS = "application/openmetrics-text"


def wants_openmetrics(accept: str | None) -> bool:
    """Whether an HTTP Accept header lists OpenMetrics (Prometheus lists it first)."""
    return any(part.split(";")[0].strip() == OPENMETRICS for part in (accept or "").split(","))


def render(accept: str | None, registry: Collector = REGISTRY) -> tuple[bytes, str]:
    """The registry's metrics and their Content-Type: OpenMetrics 1.0 (with exemplars) when
    `accept` asks for it, else the Prometheus text format 0.0.4."""
    if wants_openmetrics(accept):
        page = openmetrics.generate_latest(_Conformant(registry), escaping=openmetrics.ALLOWUTF8)
        return page, openmetrics.CONTENT_TYPE_LATEST
    return text_page(registry), CONTENT_TYPE_PLAIN_0_0_4


class _Conformant(Collector):
    """The registry's families, histograms without a _sum also without their _count."""

    def __init__(self, registry: Collector) -> None:
        self._registry = registry

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            yield _without_lone_count(family) if family.type == "histogram" else family


def _without_lone_count(family: Metric) -> Metric:
    names = {sample.name for sample in family.samples}
    if family.name + "_sum" in names or family.name + "_count" not in names:
        return family
    copy = Metric(family.name, family.documentation, family.type, family.unit)
    copy.samples = [s for s in family.samples if s.name != family.name + "_count"]
    return copy


def wsgi_app(registry: Collector = REGISTRY) -> Callable:
    """GET /metrics (HEAD too); 404 elsewhere, 405 for other methods."""

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"only /metrics here\n"]
        if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD")])
            return [b""]
        page, content_type = render(environ.get("HTTP_ACCEPT"), registry)
        start_response("200 OK", [("Content-Type", content_type)])
        return [page]

    return app


class _QuietHandler(WSGIRequestHandler):
    """No access log line per scrape."""

    def log_message(self, format: str, *args: object) -> None:
        pass


def start_server(port: int, host: str, tls: TlsSettings) -> WSGIServer:
    """Serves wsgi_app() on host:port from a daemon thread: TLS when `tls` has a certificate,
    demanding a client certificate of its CA under mutual TLS. A port already taken raises."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(host, port, wsgi_app(), Server, handler_class=_QuietHandler)
    if tls.cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # trusts no CA but the one given
        context.load_cert_chain(tls.cert, tls.key)
        if tls.client_auth:
            context.load_verify_locations(cafile=tls.ca)
            context.verify_mode = ssl.CERT_REQUIRED
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
