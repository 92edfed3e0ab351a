"""Logging, configured once per process."""

from __future__ import annotations

import logging
import os


def setup_logging(service: str) -> None:
    level = os.environ.get("LAYERSERVE_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )
    # grpc and aiohttp access logs are noise at INFO.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
