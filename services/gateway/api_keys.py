"""API keys and what each may do.

Keys live in a TOML keys file as SHA-256 digests, never as plain text:

    [[keys]]
    name = "team-a"                      # shows up in logs and usage, never the key
    sha256 = "9f86d081884c7d65..."       # `python -m services.gateway.keygen team-a` makes one
    requests_per_minute = 60             # 0 or absent: the gateway's default for the limit
    tokens_per_minute = 100000           # prompt plus completion tokens
    max_concurrent = 8                   # streams open at once
    max_priority = 0                     # highest `priority` it may ask for (default 0)
    models = ["smollm2-135m-instruct"]   # absent: every model

LAYERSERVE_API_KEYS (comma-separated plain keys, for development) adds keys with the default
limits and max_priority 0; they are hashed as they are read. A key may lower its requests'
priority (negative values) but raise it only up to its max_priority, so no tenant jumps the
others' queues unless the operator says so. Without keys every caller may use any priority.
A presented key is hashed and compared with every stored digest in constant time, so neither
the comparison nor its position in the file leaks.
"""

from __future__ import annotations

import hashlib
import hmac
import tomllib
from dataclasses import dataclass
from pathlib import Path

_LIMIT_FIELDS = ("requests_per_minute", "tokens_per_minute", "max_concurrent")
_KNOWN_FIELDS = frozenset({"name", "sha256", "models", "max_priority", *_LIMIT_FIELDS})
INT32_MAX = 2**31 - 1  # priority travels as a protobuf int32


@dataclass(frozen=True, slots=True)
class KeyLimits:
    """Per-key limits; 0 means unlimited."""

    requests_per_minute: int = 0
    tokens_per_minute: int = 0
    max_concurrent: int = 0

    def or_defaults(self, defaults: KeyLimits) -> KeyLimits:
        """Each limit this key leaves at 0 takes the default's."""
        return KeyLimits(
            self.requests_per_minute or defaults.requests_per_minute,
            self.tokens_per_minute or defaults.tokens_per_minute,
            self.max_concurrent or defaults.max_concurrent,
        )


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: str  # hex SHA-256 of the key
    limits: KeyLimits
    models: frozenset[str] | None = None  # None: every model
    max_priority: int = 0  # the highest priority its requests may ask for

    @property
    def tenant(self) -> str:
        """A stable, non-secret id of the key, for fairness, limits and accounting."""
        return "key-" + self.digest[:16]

    def may_use(self, model: str) -> bool:
        return self.models is None or model in self.models


ANONYMOUS = ApiKey(name="anonymous", digest="", limits=KeyLimits(), max_priority=INT32_MAX)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """The configured keys. Empty: authentication is off and every caller is ANONYMOUS."""

    def __init__(self, keys: list[ApiKey]) -> None:
        digests = [k.digest for k in keys]
        if len(set(digests)) != len(digests):
            raise ValueError("the same API key is configured twice")
        self._keys = [(bytes.fromhex(k.digest), k) for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, presented: str) -> ApiKey | None:
        """The key whose digest matches, compared against every key in constant time."""
        digest = hashlib.sha256(presented.encode()).digest()
        found = None
        for stored, key in self._keys:
            if hmac.compare_digest(digest, stored):
                found = key
        return found


def bearer_token(authorization: str | None) -> str | None:
    """The key of `Bearer <key>`; the scheme is case-insensitive (RFC 9110, section 11.1)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def load_key_ring(env_keys: list[str], keys_file: str | None, defaults: KeyLimits) -> KeyRing:
    keys = [ApiKey(f"env-key-{i}", hash_key(k), defaults) for i, k in enumerate(env_keys, start=1)]
    if keys_file:
        keys += read_keys_file(Path(keys_file), defaults)
    return KeyRing(keys)


def read_keys_file(path: Path, defaults: KeyLimits) -> list[ApiKey]:
    """Raises ValueError naming the file and the entry when something is wrong."""
    if not path.is_file():
        raise ValueError(f"API keys file {path} does not exist")
    try:
        entries = tomllib.loads(path.read_text()).get("keys", [])
    except tomllib.TOMLDecodeError as err:
        raise ValueError(f"API keys file {path}: {err}") from None
    if not isinstance(entries, list):
        raise ValueError(f"API keys file {path}: `keys` must be an array of tables ([[keys]])")
    return [_key_entry(path, i, entry, defaults) for i, entry in enumerate(entries)]


def _key_entry(path: Path, index: int, entry: object, defaults: KeyLimits) -> ApiKey:
    where = f"API keys file {path}, keys[{index}]"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be a table")
    unknown = set(entry) - _KNOWN_FIELDS
    if unknown:
        raise ValueError(f"{where}: unknown fields {sorted(unknown)}")
    digest = str(entry.get("sha256", "")).lower()
    if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise ValueError(f"{where}: sha256 must be 64 hex digits (the key's SHA-256, not the key)")
    limits = {}
    for name in _LIMIT_FIELDS:
        value = entry.get(name, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"{where}: {name} must be a non-negative integer")
        limits[name] = value
    max_priority = entry.get("max_priority", 0)
    if not isinstance(max_priority, int) or isinstance(max_priority, bool):
        raise ValueError(f"{where}: max_priority must be an integer")
    if not 0 <= max_priority <= INT32_MAX:
        raise ValueError(f"{where}: max_priority must be between 0 and {INT32_MAX}")
    models = entry.get("models")
    if models is not None and (
        not isinstance(models, list) or not all(isinstance(m, str) and m for m in models)
    ):
        raise ValueError(f"{where}: models must be an array of model names")
    return ApiKey(
        name=str(entry.get("name") or f"key-{index}"),
        digest=digest,
        limits=KeyLimits(**limits).or_defaults(defaults),
        models=frozenset(models) if models is not None else None,
        max_priority=max_priority,
    )
