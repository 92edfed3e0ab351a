"""The HTTP API's listening sockets: every accepted connection has the bounded send buffer."""

from __future__ import annotations

import socket

from services.gateway.listen_socket import listening_sockets


def _accepted_send_buffer(send_buffer_bytes: int) -> int:
    (listener,) = listening_sockets("127.0.0.1", 0, send_buffer_bytes)
    with listener:
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                client.sendall(b"x")
                return accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)


def test_accepted_connections_inherit_the_bounded_send_buffer() -> None:
    bounded = _accepted_send_buffer(64 * 1024)
    assert 64 * 1024 <= bounded <= 2 * 64 * 1024  # Linux doubles what is asked
    assert _accepted_send_buffer(0) != bounded  # 0: the kernel's own
