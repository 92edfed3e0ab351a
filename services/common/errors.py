"""Domain errors, and their one mapping to status codes, HTTP statuses and OpenAI error types.

Every service raises these; servers translate them at the edge. A user sees the message, never a
traceback; the operator finds the traceback in the log.

The status code is google.rpc.Code's, by name and number, so this module needs no grpc: the
worker's compute path (model runner, plan, sampler) raises these errors on a machine that has
only torch and triton (the GPU check). The grpc.StatusCode of an error is
services.common.grpc_status's, used by the servers.
"""

from __future__ import annotations

# google.rpc.Code (google/rpc/code.proto): the numbers common.v1.Status carries on the wire.
RPC_CODES: dict[str, int] = {
    "OK": 0,
    "CANCELLED": 1,
    "UNKNOWN": 2,
    "INVALID_ARGUMENT": 3,
    "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5,
    "ALREADY_EXISTS": 6,
    "PERMISSION_DENIED": 7,
    "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9,
    "ABORTED": 10,
    "OUT_OF_RANGE": 11,
    "UNIMPLEMENTED": 12,
    "INTERNAL": 13,
    "UNAVAILABLE": 14,
    "DATA_LOSS": 15,
    "UNAUTHENTICATED": 16,
}


class LayerserveError(Exception):
    """Base class: a failure with a message fit for the client."""

    rpc_code: str = "INTERNAL"  # a name of RPC_CODES
    http_status: int = 500
    openai_type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidArgument(LayerserveError):
    rpc_code = "INVALID_ARGUMENT"
    http_status = 400
    openai_type = "invalid_request_error"


class NotFound(LayerserveError):
    rpc_code = "NOT_FOUND"
    http_status = 404
    openai_type = "invalid_request_error"


class Unauthenticated(LayerserveError):
    rpc_code = "UNAUTHENTICATED"
    http_status = 401
    openai_type = "invalid_request_error"


class ResourceExhausted(LayerserveError):
    rpc_code = "RESOURCE_EXHAUSTED"
    http_status = 429
    openai_type = "rate_limit_error"
    # Seconds a client should wait before retrying (HTTP Retry-After).
    retry_after: int = 1


class DeadlineExceeded(LayerserveError):
    rpc_code = "DEADLINE_EXCEEDED"
    http_status = 504
    openai_type = "timeout_error"


class Unavailable(LayerserveError):
    rpc_code = "UNAVAILABLE"
    http_status = 503
    openai_type = "service_unavailable"
    retry_after: int = 1


class Cancelled(LayerserveError):
    rpc_code = "CANCELLED"
    http_status = 499
    openai_type = "cancelled"


class Internal(LayerserveError):
    pass


_BY_NUMBER: dict[int, type[LayerserveError]] = {
    RPC_CODES[cls.rpc_code]: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unauthenticated,
        ResourceExhausted,
        DeadlineExceeded,
        Unavailable,
        Cancelled,
        Internal,
    )
}


def error_from_code(code: int, message: str, param: str = "") -> LayerserveError:
    """The domain error for a google.rpc.Code number (Internal for any other); param: the
    field it is about, as common.v1.Status carries it ("" = none)."""
    return _BY_NUMBER.get(code, Internal)(message, param=param or None)


def code_number(error: LayerserveError) -> int:
    """The google.rpc.Code number of an error, as carried in common.v1.Status."""
    return RPC_CODES[error.rpc_code]


def openai_error_body(error: LayerserveError) -> dict:
    """An OpenAI-style error body (schema ErrorResponse)."""
    return {
        "error": {
            "message": error.message,
            "type": error.openai_type,
            "param": error.param,
            "code": error.rpc_code.lower(),
        }
    }
