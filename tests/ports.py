"""Free loopback ports for the tests' servers."""

from __future__ import annotations

import socket

# Every port free_ports has handed out in this process: a test that picks ports of its own and
# then a stack's (loopback_config) must not get one twice, as the kernel may offer a port again
# once its probe socket is closed (a worker once got the scheduler's port: "Method not found").
_handed_out: set[int] = set()


def free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    while len(ports) < count:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)  # held open until all are picked, so no port comes twice here either
        port = s.getsockname()[1]
        if port not in _handed_out:
            ports.append(port)
            _handed_out.add(port)
    for s in sockets:
        s.close()
    return ports
