"""Who may call the internal ports (tokenizer, scheduler, worker), from LAYERSERVE_* env vars.

A caller that reaches an internal port could otherwise submit work under any tenant, past the
gateway's keys and limits. Two ways shut it out: a token shared by the stack's processes,
which every internal client sends (metadata `x-layerserve-internal-token`) and every internal
server checks on every rpc but health checks (services/common/token_check.py); or mutual TLS
(LAYERSERVE_TLS_CLIENT_AUTH=1, services/common/tls.py).

- LAYERSERVE_INTERNAL_TOKEN: the token (at least 16 characters); `make run` generates one per
  run and hands it to its children.
- LAYERSERVE_INTERNAL_TOKEN_FILE: a file that holds it instead (a mounted Secret); surrounding
  whitespace is ignored.
- LAYERSERVE_ALLOW_INSECURE_INTERNAL=1: lets an internal port listen beyond loopback with
  neither a token nor mutual TLS (a network you trust); without it such a service refuses to
  start.

`python -m services.common.internal_auth generate FILE` writes a new random token to FILE
unless it exists (docker compose's one-shot `internal-token` service).
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.common.env import PREFIX
from services.common.tls import TlsSettings

METADATA_KEY = "x-layerserve-internal-token"
MIN_TOKEN_CHARS = 16
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


class InternalAuthError(ValueError):
    """A setting that would leave internal ports open, or cannot be read: the service refuses
    to start with this one line (services/common/serve.py run_service)."""


@dataclass(frozen=True)
class InternalAuth:
    token: str | None = None
    allow_insecure: bool = False

    def __post_init__(self) -> None:
        if self.token is not None and len(self.token) < MIN_TOKEN_CHARS:
            raise InternalAuthError(
                f"{PREFIX}INTERNAL_TOKEN is {len(self.token)} characters; it needs at least "
                f"{MIN_TOKEN_CHARS} (e.g. `openssl rand -hex 32`)"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> InternalAuth:
        """Reads the variables above; ValueError on a conflicting or unreadable set."""
        env = os.environ if environ is None else environ
        token = env.get(f"{PREFIX}INTERNAL_TOKEN", "").strip() or None
        path = env.get(f"{PREFIX}INTERNAL_TOKEN_FILE", "").strip()
        if path and token:
            raise InternalAuthError(
                f"{PREFIX}INTERNAL_TOKEN and {PREFIX}INTERNAL_TOKEN_FILE are both set; set one"
            )
        if path:
            token = _read_token(Path(path))
        raw = env.get(f"{PREFIX}ALLOW_INSECURE_INTERNAL", "").strip().lower()
        if raw not in _TRUE | _FALSE:
            raise InternalAuthError(f"{PREFIX}ALLOW_INSECURE_INTERNAL must be 1 or 0, got {raw!r}")
        return cls(token=token, allow_insecure=raw in _TRUE)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """What an internal client sends with every call (nothing without a token)."""
        return ((METADATA_KEY, self.token),) if self.token else ()

    def accepts(self, sent: str | bytes | None) -> bool:
        """Whether `sent` (the caller's metadata value) is the token; constant-time."""
        if self.token is None:
            return True
        if sent is None:
            return False
        sent_bytes = sent.encode() if isinstance(sent, str) else sent
        return hmac.compare_digest(sent_bytes, self.token.encode())

    def check_bind(self, address: str, tls: TlsSettings) -> None:
        """Raises ValueError (one line, for the start-up error) when an internal port on
        `address` would take calls from other hosts with nothing to authenticate them."""
        if self.token or tls.client_auth or self.allow_insecure or is_loopback(address):
            return
        raise InternalAuthError(
            f"refusing to listen on {address} without internal authentication: set "
            f"{PREFIX}INTERNAL_TOKEN (or {PREFIX}INTERNAL_TOKEN_FILE) on every service, or "
            f"mutual TLS ({PREFIX}TLS_CLIENT_AUTH=1), or {PREFIX}ALLOW_INSECURE_INTERNAL=1 "
            "on a network you trust"
        )


def is_loopback(address: str) -> bool:
    """Whether a gRPC bind address (`host:port`, `[v6]:port`, `unix:path`) is reachable from
    this host only. A host name other than localhost counts as reachable from others."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0] if ":" in address else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(32)


def _read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as err:
        raise InternalAuthError(
            f"{PREFIX}INTERNAL_TOKEN_FILE={path} is not readable: {err}"
        ) from None
    if not token:
        raise InternalAuthError(f"{PREFIX}INTERNAL_TOKEN_FILE={path} is empty")
    return token


def generate(path: Path) -> bool:
    """Writes a new token to `path` (mode 0600) unless it exists; True if it wrote one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(new_token() + "\n")
    return True


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "generate":
        print("usage: python -m services.common.internal_auth generate FILE", file=sys.stderr)
        return 2
    wrote = generate(Path(argv[1]))
    print(f"{'wrote a new' if wrote else 'kept the'} internal token in {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
