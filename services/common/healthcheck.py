"""`python -m services.common.healthcheck HOST:PORT [--service NAME] [--timeout S]`: one
grpc.health.v1 Check, for container health checks (docker compose, Kubernetes exec probes).

Exits 0 when the answer is SERVING and 1 otherwise (NOT_SERVING, an unknown service, nothing
listening, a timeout), printing the status either way: Docker keeps that line in the
container's health log. Dials with the process's LAYERSERVE_TLS_* settings, like the services
themselves, so the same check works on a TLS stack.
"""

from __future__ import annotations

import argparse
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.grpc_util import new_sync_channel

SERVING = health_pb2.HealthCheckResponse.SERVING


def check(address: str, service: str = "", timeout: float = 3.0) -> str:
    """The status `address` reports for `service` ("" = the whole server), by name; for a
    failed call, the gRPC status code's name and its details."""
    with new_sync_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            # No wait_for_ready: with nothing listening the call fails at once (UNAVAILABLE)
            # instead of waiting out the timeout.
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            return f"{err.code().name}: {err.details()}"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m services.common.healthcheck",
        description="Exit 0 when the gRPC service at HOST:PORT reports SERVING, else 1.",
    )
    p.add_argument("address", metavar="HOST:PORT")
    p.add_argument(
        "--service",
        default="",
        help="a full service name, e.g. layerserve.worker.v1.Worker (default: the whole server)",
    )
    p.add_argument("--timeout", type=float, default=3.0, help="seconds (default 3)")
    a = p.parse_args(argv)
    if not a.timeout > 0:
        p.error("--timeout must be positive")
    try:
        status = check(a.address, a.service, a.timeout)
    except ValueError as err:  # inconsistent LAYERSERVE_TLS_* settings
        status = f"configuration error: {err}"
    print(f"{a.address} {a.service or '(server)'}: {status}")
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
