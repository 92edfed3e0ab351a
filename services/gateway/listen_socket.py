"""The HTTP API's listening sockets, made here rather than by aiohttp so that the kernel's send
buffer of every connection is bounded.

A client that stops reading is noticed only when a write to it blocks (choice_streams.py's
`write_within` then cuts it off after stalled_client_seconds). Left to Linux's autotuning, a
connection's send buffer grows up to net.ipv4.tcp_wmem's maximum (4 MiB by default): the
gateway could push megabytes into a client that reads nothing, and keep generating for it,
before one write waits. A fixed SO_SNDBUF turns the autotuning off for the socket; set on the
listening socket, it is inherited by every connection accepted from it (Linux).
"""

from __future__ import annotations

import socket

# Why 256 KiB: Linux doubles what is asked (for its bookkeeping), so a connection holds at most
# ~512 KiB unsent: about 2,500 SSE chunks of plain text, 250 with 20 top logprobs. A stalled
# client is then noticed within seconds, and 100 of them pin at most ~50 MiB of kernel memory
# (autotuned: 4 MiB each, 400 MiB). One connection still carries up to sndbuf / RTT, ~4 MB/s
# at a 100 ms round trip: more than one request streams (and a slower drain merges chunks).
DEFAULT_SEND_BUFFER_BYTES = 256 * 1024


def listening_sockets(host: str, port: int, send_buffer_bytes: int) -> list[socket.socket]:
    """Bound sockets, one per address `host` resolves to ("" = every interface), as asyncio's
    create_server binds them; not yet listening (aiohttp's SockSite listens). A positive
    `send_buffer_bytes` is every accepted connection's SO_SNDBUF; 0 keeps the kernel's."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # as asyncio does: no IPv4 through an IPv6 socket
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if send_buffer_bytes > 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send_buffer_bytes)
            try:
                sock.bind(address)
            except OSError as err:
                what = f"error while attempting to bind on address {address!r}"  # asyncio's words
                raise OSError(err.errno, f"{what}: {err.strerror}") from None
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets
