"""Every LAYERSERVE_* environment variable, read in one place."""

from __future__ import annotations

import os

from services.common.settings import SettingError

PREFIX = "LAYERSERVE_"


def env_str(name: str, default: str) -> str:
    return os.environ.get(PREFIX + name, default)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingError(f"{PREFIX}{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(PREFIX + name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise SettingError(f"{PREFIX}{name} must be a number, got {raw!r}") from None


def env_list(name: str) -> list[str]:
    """A comma-separated list; empty entries are dropped."""
    return [item.strip() for item in os.environ.get(PREFIX + name, "").split(",") if item.strip()]
