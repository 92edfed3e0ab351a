"""Settings every long-running service has, as fields for its config dataclass
(services/common/settings.py): `drain_timeout_s: float = drain_timeout_setting()`."""

from __future__ import annotations

from typing import Any

from services.common.metrics import check_metrics_port
from services.common.serve import DEFAULT_DRAIN_TIMEOUT_S, check_drain_timeout
from services.common.settings import setting


def drain_timeout_setting() -> Any:
    """--drain-timeout-s / LAYERSERVE_DRAIN_TIMEOUT_S: on SIGTERM, for requests in flight."""
    return setting(
        "--drain-timeout-s",
        env="DRAIN_TIMEOUT_S",
        default=DEFAULT_DRAIN_TIMEOUT_S,
        check=check_drain_timeout,
        help="on SIGTERM, seconds that requests in flight get to finish before exiting",
    )


def metrics_port_setting() -> Any:
    """--metrics-port / LAYERSERVE_METRICS_PORT: Prometheus /metrics on the service's --host;
    0 = none."""
    return setting(
        "--metrics-port",
        env="METRICS_PORT",
        default=0,
        check=check_metrics_port,
        help="serve Prometheus metrics at http://HOST:PORT/metrics (env LAYERSERVE_METRICS_PORT; "
        "0: no metrics server)",
    )
