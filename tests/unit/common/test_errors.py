"""Domain errors carry google.rpc.Code names and numbers without grpc; the edge's mapping
(services/common/grpc_status.py) agrees with grpc's own enum, both ways."""

from __future__ import annotations

import grpc
import pytest

from services.common.errors import (
    RPC_CODES,
    Cancelled,
    DeadlineExceeded,
    Internal,
    InvalidArgument,
    LayerserveError,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    code_number,
    error_from_code,
    openai_error_body,
)
from services.common.grpc_status import error_from_status, grpc_code

ERRORS = (
    InvalidArgument, NotFound, Unauthenticated, ResourceExhausted, DeadlineExceeded,
    Unavailable, Cancelled, Internal,
)  # fmt: skip


def test_rpc_codes_are_grpcs_numbers() -> None:
    assert RPC_CODES == {code.name: code.value[0] for code in grpc.StatusCode}


@pytest.mark.parametrize("cls", ERRORS)
def test_each_error_round_trips_through_number_and_grpc_code(cls: type) -> None:
    error = cls("boom")
    assert grpc_code(error).value[0] == code_number(error)
    assert type(error_from_code(code_number(error), "x")) is cls
    assert type(error_from_status(grpc_code(error), "x")) is cls
    assert openai_error_body(error)["error"]["code"] == grpc_code(error).name.lower()


def test_unknown_codes_are_internal() -> None:
    assert type(error_from_code(999, "x")) is Internal
    assert type(error_from_status(grpc.StatusCode.ABORTED, "x")) is Internal
    assert grpc_code(LayerserveError("x")) == grpc.StatusCode.INTERNAL
