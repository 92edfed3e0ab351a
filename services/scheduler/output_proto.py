"""Output <-> scheduler.v1.RequestOutput (the servers' side of the wire)."""

from __future__ import annotations

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from services.common.errors import code_number
from services.scheduler.output import Output
from services.scheduler.request import FinishReason

_FINISH = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}


def output_to_proto(output: Output) -> scheduler_pb2.RequestOutput:
    msg = scheduler_pb2.RequestOutput(
        request_id=output.request_id,
        token_ids=output.token_ids,
        prompt_tokens=output.prompt_tokens,
        cached_tokens=output.cached_tokens,
        migrations=output.migrations,
    )
    msg.logprobs.extend(output.logprobs)
    msg.prompt_logprobs.extend(output.prompt_logprobs)
    if output.embedding is not None:
        msg.embedding.extend(output.embedding)
    if output.finish_reason is not None:
        msg.finish_reason = _FINISH[output.finish_reason]
    if output.error is not None:
        msg.error.CopyFrom(
            common_pb2.Status(
                code=code_number(output.error),
                message=output.error.message,
                param=output.error.param or "",
            )
        )
    return msg
