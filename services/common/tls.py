"""TLS between the services (and on the gateway's public ports), from LAYERSERVE_TLS_* env vars.

Every service reads the same variables, so one certificate serves a whole stack: it must name
every host the services are reached at (the launcher dials 127.0.0.1) and, under mutual TLS,
allow both server and client use, since each service is both.

- LAYERSERVE_TLS_CERT: PEM certificate chain of this service. With LAYERSERVE_TLS_KEY it turns
  TLS on: servers accept only TLS, clients dial with TLS.
- LAYERSERVE_TLS_KEY: the PEM private key of that certificate.
- LAYERSERVE_TLS_CA: PEM bundle that verifies peers; without it clients trust the system roots.
  Alone (no cert) it is enough for a process that only dials, such as the admin CLI.
- LAYERSERVE_TLS_CLIENT_AUTH=1: mutual TLS on the internal ports: servers require a client
  certificate signed by the CA, clients present theirs.
- LAYERSERVE_TLS_SERVER_NAME: the name expected in servers' certificates instead of the host
  dialled (for certificates issued to a DNS name while addresses are IPs).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from services.common.env import PREFIX

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"", "0", "false", "no", "off"}


@dataclass(frozen=True)
class TlsSettings:
    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    client_auth: bool = False
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            given, missing = ("CERT", "KEY") if self.key is None else ("KEY", "CERT")
            raise ValueError(
                f"{PREFIX}TLS_{given} is set without {PREFIX}TLS_{missing}: "
                "a certificate is useless without its private key, and the other way round"
            )
        if self.client_auth and self.ca is None:
            raise ValueError(
                f"{PREFIX}TLS_CLIENT_AUTH=1 needs {PREFIX}TLS_CA to verify client certificates"
            )
        if self.client_auth and self.cert is None:
            raise ValueError(
                f"{PREFIX}TLS_CLIENT_AUTH=1 needs {PREFIX}TLS_CERT and {PREFIX}TLS_KEY: "
                "under mutual TLS every service presents a certificate"
            )
        for name, path in (("CERT", self.cert), ("KEY", self.key), ("CA", self.ca)):
            if path is not None and not path.is_file():
                raise ValueError(f"{PREFIX}TLS_{name}={path} is not a readable file")
        if self.cert is not None:
            _check_pair(self.cert, self.key)
        if self.ca is not None:
            _check_ca(self.ca)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsSettings:
        """Reads LAYERSERVE_TLS_*; raises ValueError on an inconsistent or unreadable set."""
        env = os.environ if environ is None else environ

        def path(name: str) -> Path | None:
            raw = env.get(f"{PREFIX}TLS_{name}", "").strip()
            return Path(raw) if raw else None

        raw_auth = env.get(f"{PREFIX}TLS_CLIENT_AUTH", "").strip().lower()
        if raw_auth not in _TRUE | _FALSE:
            raise ValueError(f"{PREFIX}TLS_CLIENT_AUTH must be 1 or 0, got {raw_auth!r}")
        return cls(
            cert=path("CERT"),
            key=path("KEY"),
            ca=path("CA"),
            client_auth=raw_auth in _TRUE,
            server_name=env.get(f"{PREFIX}TLS_SERVER_NAME", "").strip() or None,
        )

    @property
    def enabled(self) -> bool:
        """Whether clients dial with TLS (a CA alone is enough to dial)."""
        return self.cert is not None or self.ca is not None

    @property
    def can_serve(self) -> bool:
        return self.cert is not None

    def without_client_auth(self) -> TlsSettings:
        """The same certificate, no client certificates asked for (the gateway's public ports,
        whose callers authenticate with API keys)."""
        return replace(self, client_auth=False)

    def require_serving(self) -> None:
        """Raises ValueError when clients would dial TLS but this process cannot serve it."""
        if self.enabled and not self.can_serve:
            raise ValueError(
                f"{PREFIX}TLS_CA is set without {PREFIX}TLS_CERT and {PREFIX}TLS_KEY: "
                "a service needs its own certificate to serve TLS"
            )

    def read(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(certificate chain, private key, CA bundle) as PEM bytes, None where unset."""
        return tuple(p.read_bytes() if p else None for p in (self.cert, self.key, self.ca))

    def server_ssl_context(self) -> ssl.SSLContext:
        """For the gateway's HTTPS port; it never asks for client certificates."""
        self.require_serving()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert, self.key)
        return context

    def client_ssl_context(self) -> ssl.SSLContext:
        """For HTTPS callers such as the launcher's health probe."""
        context = ssl.create_default_context(cafile=self.ca)
        if self.client_auth:
            context.load_cert_chain(self.cert, self.key)
        return context


def _check_pair(cert: Path, key: Path | None) -> None:
    """Fails at start-up, not at the first handshake, on a non-PEM file or a mismatched key."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as err:
        raise ValueError(
            f"{PREFIX}TLS_CERT={cert} and {PREFIX}TLS_KEY={key} are not a PEM certificate "
            f"chain and its private key: {err}"
        ) from None


def _check_ca(ca: Path) -> None:
    try:
        ssl.create_default_context(cafile=ca)
    except (ssl.SSLError, OSError) as err:
        raise ValueError(f"{PREFIX}TLS_CA={ca} is not a PEM certificate bundle: {err}") from None
