"""API keys: from LAYERSERVE_API_KEYS (comma-separated) or a keys file (one per line)."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path


def load_api_keys(env_keys: list[str], keys_file: str | None) -> frozenset[str]:
    keys = set(env_keys)
    if keys_file:
        path = Path(keys_file)
        if not path.is_file():
            raise ValueError(f"API keys file {keys_file} does not exist")
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.add(line)
    return frozenset(keys)


def tenant_id(authorization: str | None) -> str:
    """A stable, non-secret id of the caller's key, for fairness and accounting ("" if none)."""
    if not authorization or not authorization.startswith("Bearer "):
        return ""
    key = authorization[len("Bearer ") :].strip()
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def is_authorized(keys: frozenset[str], authorization: str | None) -> bool:
    """True when no keys are configured, or the header is `Bearer <a configured key>`."""
    if not keys:
        return True
    if not authorization or not authorization.startswith("Bearer "):
        return False
    presented = authorization[len("Bearer ") :].strip().encode()
    # Compare against every key in constant time so timing reveals nothing about the keys.
    # As bytes: compare_digest refuses non-ASCII str.
    return any(hmac.compare_digest(presented, key.encode()) for key in keys)
