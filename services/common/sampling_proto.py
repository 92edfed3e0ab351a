"""SamplingOptions and StructuredOutput (services/common/sampling.py) to and from their
protobuf form (common.v1.SamplingParams, common.v1.StructuredOutput), at the servers' edges."""

from __future__ import annotations

from layerserve.common.v1 import common_pb2
from services.common.sampling import Pooling, SamplingOptions, StructuredOutput

POOLING: dict[Pooling, int] = {"last": common_pb2.POOLING_LAST, "mean": common_pb2.POOLING_MEAN}
_POOLING_OF = {number: name for name, number in POOLING.items()}


def structured_to_proto(structured: StructuredOutput) -> common_pb2.StructuredOutput:
    if structured.kind == "choice":
        return common_pb2.StructuredOutput(choice=common_pb2.Choices(values=structured.value))
    if structured.kind == "json_object":
        return common_pb2.StructuredOutput(json_object=True)
    return common_pb2.StructuredOutput(**{structured.kind: structured.value})


def structured_from_proto(msg: common_pb2.StructuredOutput) -> StructuredOutput | None:
    """None when no kind is set (json_object false counts as unset)."""
    kind = msg.WhichOneof("kind")
    if kind is None or (kind == "json_object" and not msg.json_object):
        return None
    if kind == "choice":
        return StructuredOutput("choice", tuple(msg.choice.values))
    if kind == "json_object":
        return StructuredOutput("json_object")
    return StructuredOutput(kind, getattr(msg, kind))


def sampling_to_proto(options: SamplingOptions) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        min_p=options.min_p,
        repetition_penalty=options.repetition_penalty,
        presence_penalty=options.presence_penalty,
        frequency_penalty=options.frequency_penalty,
    )
    if options.seed is not None:
        msg.seed = options.seed
    if options.logprobs is not None:
        msg.logprobs = options.logprobs
    if options.prompt_logprobs is not None:
        msg.prompt_logprobs = options.prompt_logprobs
    if options.pooling is not None:
        msg.pooling = POOLING[options.pooling]  # type: ignore[assignment]
    if options.structured is not None:
        msg.structured.CopyFrom(structured_to_proto(options.structured))
    return msg


def sampling_from_proto(msg: common_pb2.SamplingParams) -> SamplingOptions:
    """Zero values the wire cannot tell from unset take the defaults (top_p, the penalty)."""
    return SamplingOptions(
        temperature=msg.temperature,
        top_p=msg.top_p if msg.top_p > 0 else 1.0,
        top_k=msg.top_k,
        min_p=msg.min_p,
        repetition_penalty=msg.repetition_penalty if msg.repetition_penalty > 0 else 1.0,
        presence_penalty=msg.presence_penalty,
        frequency_penalty=msg.frequency_penalty,
        seed=msg.seed if msg.HasField("seed") else None,
        logprobs=msg.logprobs if msg.HasField("logprobs") else None,
        prompt_logprobs=msg.prompt_logprobs if msg.HasField("prompt_logprobs") else None,
        pooling=_POOLING_OF.get(msg.pooling),
        structured=(structured_from_proto(msg.structured) if msg.HasField("structured") else None),
    )
