"""What every fuzzed gRPC call must end with, and the strategies the fuzz tests share."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import grpc
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from layerserve.common.v1 import common_pb2
from tests.reliability.conftest import FUZZ_PHASES, MODEL
from tests.reliability.proto_strategies import ODD_STRINGS, messages

T = TypeVar("T")

# A crash in the service (an exception nobody translated) shows as INTERNAL or UNKNOWN; every
# other code is the service saying, cleanly, what it thinks of the request.
CRASH_CODES = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})
CRASH_NUMBERS = frozenset(code.value[0] for code in CRASH_CODES)  # as in common.v1.Status
CALL_TIMEOUT = 30.0  # a call still open after this long is a hang

FUZZ = settings(
    max_examples=100,
    # Real processes on a shared 2-core box: no per-example time limit of Hypothesis' own,
    # which would fail a slow example; each call's CALL_TIMEOUT bounds an example instead.
    deadline=None,
    phases=FUZZ_PHASES,
    database=None,  # nothing written into the repository
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

MODEL_NAMES = st.integers(0, 3).flatmap(lambda i: ODD_STRINGS if i == 0 else st.just(MODEL))
REQUEST_IDS = st.one_of(st.sampled_from(["r0", "r1", "r2", ""]), ODD_STRINGS)
# Small enough to finish quickly when valid; the rest are what a client might get wrong.
MAX_TOKENS = st.one_of(st.integers(1, 4), st.sampled_from([-1, -(2**31), 2**31 - 1, 9000, 10**6]))
TOKEN_IDS = st.one_of(
    st.lists(st.integers(0, 2000), min_size=1, max_size=24),
    st.lists(
        st.one_of(st.integers(0, 2000), st.sampled_from([-1, 49152, -(2**31), 2**31 - 1])),
        max_size=24,
    ),
)

_F32 = {"width": 32}
SANE_SAMPLING = st.builds(
    common_pb2.SamplingParams,
    temperature=st.floats(0, 2, **_F32),
    top_p=st.floats(0, 1, **_F32),
    top_k=st.integers(0, 100),
    min_p=st.floats(0, 1, **_F32),
    repetition_penalty=st.floats(0, 2, **_F32),
    presence_penalty=st.floats(-2, 2, **_F32),
    frequency_penalty=st.floats(-2, 2, **_F32),
    seed=st.integers(0, 2**63 - 1),
    logprobs=st.integers(0, 20),
)
# Unset (greedy), sane, or anything at all (NaN temperatures, negative top_k, ...).
SAMPLING = st.one_of(st.none(), SANE_SAMPLING, messages(common_pb2.SamplingParams))


def clean_call(call: Callable[[], T]) -> T | None:
    """Runs a call; returns its result, or None when it ended with a clean error status."""
    try:
        return call()
    except grpc.RpcError as err:
        assert_clean_error(err)
        return None


def assert_clean_error(err: grpc.RpcError) -> None:
    code = err.code()
    assert code not in CRASH_CODES, f"{code.name}: {err.details()}"
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer in {CALL_TIMEOUT}s"


def assert_clean_status(code: int, message: str) -> None:
    """A per-request common.v1.Status carried inside a stream."""
    assert code not in CRASH_NUMBERS, f"status {code}: {message}"
