"""The gRPC status code of a domain error (services/common/errors.py), for the servers and
clients at the edges: the domain modules name codes by google.rpc.Code and import no grpc."""

from __future__ import annotations

import grpc

from services.common.errors import LayerserveError, error_from_code


def grpc_code(error: LayerserveError) -> grpc.StatusCode:
    """The grpc.StatusCode to abort an rpc with for this error."""
    return grpc.StatusCode[error.rpc_code]


def error_from_status(code: grpc.StatusCode, message: str) -> LayerserveError:
    """The domain error for a grpc.StatusCode (Internal for a code with no domain error)."""
    return error_from_code(code.value[0], message)
