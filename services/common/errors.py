"""Domain errors, and their one mapping to gRPC status codes, HTTP statuses and OpenAI error types.

Every service raises these; servers translate them at the edge. A user sees the message, never a
traceback; the operator finds the traceback in the log.
"""

from __future__ import annotations

import grpc


class LayerserveError(Exception):
    """Base class: a failure with a message fit for the client."""

    grpc_code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    http_status: int = 500
    openai_type: str = "server_error"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidArgument(LayerserveError):
    grpc_code = grpc.StatusCode.INVALID_ARGUMENT
    http_status = 400
    openai_type = "invalid_request_error"


class NotFound(LayerserveError):
    grpc_code = grpc.StatusCode.NOT_FOUND
    http_status = 404
    openai_type = "invalid_request_error"


class Unauthenticated(LayerserveError):
    grpc_code = grpc.StatusCode.UNAUTHENTICATED
    http_status = 401
    openai_type = "invalid_request_error"


class ResourceExhausted(LayerserveError):
    grpc_code = grpc.StatusCode.RESOURCE_EXHAUSTED
    http_status = 429
    openai_type = "rate_limit_error"
    # Seconds a client should wait before retrying (HTTP Retry-After).
    retry_after: int = 1


class DeadlineExceeded(LayerserveError):
    grpc_code = grpc.StatusCode.DEADLINE_EXCEEDED
    http_status = 504
    openai_type = "timeout_error"


class Unavailable(LayerserveError):
    grpc_code = grpc.StatusCode.UNAVAILABLE
    http_status = 503
    openai_type = "service_unavailable"
    retry_after: int = 1


class Cancelled(LayerserveError):
    grpc_code = grpc.StatusCode.CANCELLED
    http_status = 499
    openai_type = "cancelled"


class Internal(LayerserveError):
    pass


_BY_CODE: dict[grpc.StatusCode, type[LayerserveError]] = {
    cls.grpc_code: cls
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
_BY_NUMBER: dict[int, grpc.StatusCode] = {code.value[0]: code for code in grpc.StatusCode}


def error_from_code(code: grpc.StatusCode | int, message: str) -> LayerserveError:
    """The domain error for a gRPC status code (enum or its google.rpc.Code number)."""
    if isinstance(code, int):
        code = _BY_NUMBER.get(code, grpc.StatusCode.INTERNAL)
    return _BY_CODE.get(code, Internal)(message)


def code_number(error: LayerserveError) -> int:
    """The google.rpc.Code number of an error, as carried in common.v1.Status."""
    return error.grpc_code.value[0]


def openai_error_body(error: LayerserveError) -> dict:
    """An OpenAI-style error body (schema ErrorResponse)."""
    return {
        "error": {
            "message": error.message,
            "type": error.openai_type,
            "param": error.param,
            "code": error.grpc_code.name.lower(),
        }
    }
