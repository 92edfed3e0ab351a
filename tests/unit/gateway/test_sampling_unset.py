"""The gateway names the sampling fields a client left out, so that the tokenizer can give them
the model's recommended values (HTTP: each field absent or null; gRPC: no sampling message)."""

from __future__ import annotations

from layerserve.common.v1 import common_pb2
from layerserve.gateway.v1 import gateway_pb2
from services.gateway.backend import MODEL_DEFAULT_FIELDS
from services.gateway.grpc_api import request_from_proto
from services.gateway.tokenizer_client import request_to_proto


def test_grpc_without_sampling_leaves_every_field_to_the_model() -> None:
    request = request_from_proto(gateway_pb2.GenerateRequest(model="m", prompt="a"), "g", {})
    assert request.sampling_unset == MODEL_DEFAULT_FIELDS
    assert request.sampling.temperature == 0.0  # greedy where the model recommends nothing
    assert list(request_to_proto(request).sampling_unset) == list(MODEL_DEFAULT_FIELDS)


def test_grpc_with_sampling_is_taken_as_given() -> None:
    message = gateway_pb2.GenerateRequest(
        model="m", prompt="a", sampling=common_pb2.SamplingParams()
    )
    request = request_from_proto(message, "g", {})
    assert request.sampling_unset == ()
    assert list(request_to_proto(request).sampling_unset) == []
