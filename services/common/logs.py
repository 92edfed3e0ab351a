"""Logging, configured once per process."""

from __future__ import annotations

import logging
import os

from services.common.settings import exit_for_setting

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def setup_logging(service: str) -> None:
    """A bad LAYERSERVE_LOG_LEVEL is one line and exit status 2 (a setting error)."""
    raw = os.environ.get("LAYERSERVE_LOG_LEVEL", "INFO")
    level = raw.upper()
    if level not in LEVELS:
        allowed = ", ".join(LEVELS)
        exit_for_setting(service, f"LAYERSERVE_LOG_LEVEL={raw}: must be one of {allowed}")
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s %(levelname)s {service} %(name)s: %(message)s",
    )
    # grpc and aiohttp access logs are noise at INFO.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
