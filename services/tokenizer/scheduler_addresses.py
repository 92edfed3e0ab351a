"""Where the scheduler replicas are: `--scheduler` as a comma-separated list of HOST:PORT, or
`dns:///HOST:PORT`, a name that resolves to every replica (a Kubernetes headless Service): it
is looked up again on every refresh, so replicas that come and go are followed."""

from __future__ import annotations

import asyncio
import socket

DNS_PREFIX = "dns:///"


def parse_schedulers(spec: str) -> tuple[str, ...]:
    """The entries of a --scheduler value, in order. Raises ValueError when malformed."""
    entries = tuple(part.strip() for part in spec.split(","))
    if not entries or any(not e for e in entries):
        raise ValueError(
            f"--scheduler needs HOST:PORT[,HOST:PORT...] or dns:///HOST:PORT: {spec!r}"
        )
    for entry in entries:
        host, _, port = entry.removeprefix(DNS_PREFIX).rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"--scheduler entry {entry!r} is not HOST:PORT")
        if entry.startswith(DNS_PREFIX) and len(entries) > 1:
            raise ValueError("--scheduler takes one dns:/// name or a list of HOST:PORT, not both")
    return entries


async def resolve_schedulers(entries: tuple[str, ...]) -> list[str]:
    """HOST:PORT of every replica now: the list itself, or what the dns:/// name resolves to
    (sorted; empty when it resolves to nothing yet, e.g. no replica is up)."""
    if len(entries) != 1 or not entries[0].startswith(DNS_PREFIX):
        return list(entries)
    host, _, port = entries[0].removeprefix(DNS_PREFIX).rpartition(":")
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    addresses = {_host_port(info[4][0], int(port)) for info in infos}
    return sorted(addresses)


def _host_port(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
