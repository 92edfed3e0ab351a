"""`Backend` over the tokenizer service: every request multiplexed on one Session stream."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from layerserve.common.v1 import common_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common import tracing
from services.common.errors import LayerserveError, Unavailable, error_from_code
from services.common.grpc_util import new_channel
from services.common.health import SERVING, service_name
from services.common.mux import MuxClient, MuxProtocol
from services.common.sampling_proto import sampling_to_proto
from services.gateway import request_span
from services.gateway.backend import (
    GenerationDelta,
    GenerationRequest,
    ModelCard,
    TokenLogprob,
    ToolCall,
    TopLogprob,
)

_FINISH = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
}


def request_to_proto(
    req: GenerationRequest, trace_context: Mapping[str, str] | None = None
) -> tokenizer_pb2.GenerateRequest:
    """trace_context: the W3C context the tokenizer continues (default: req.trace_context)."""
    msg = tokenizer_pb2.GenerateRequest(
        request_id=req.request_id,
        model=req.model,
        sampling=sampling_to_proto(req.sampling),
        sampling_unset=req.sampling_unset,
        # Only a token-id prompt needs the tokenizer's text to be echoed.
        echo=req.echo and req.prompt_token_ids is not None,
        embed=req.embed,
        # The one place MaxTokens meets the wire (max_tokens.py).
        max_tokens=req.max_tokens.limit,
        max_tokens_is_cap=req.max_tokens.is_cap,
        stop=req.stop,
        stop_token_ids=req.stop_token_ids,
        ignore_eos=req.ignore_eos,
        skip_special_tokens=req.skip_special_tokens,
        priority=req.priority,
        trace=common_pb2.TraceContext(
            carrier=req.trace_context if trace_context is None else trace_context
        ),
        tenant=req.tenant,
        max_prompt_tokens=req.max_prompt_tokens,
    )
    if req.messages is not None:
        msg.chat.add_generation_prompt = req.add_generation_prompt
        for m in req.messages:
            msg.chat.messages.add(
                role=m.role,
                content=m.content,
                tool_calls=[
                    tokenizer_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                    for c in m.tool_calls
                ],
                tool_call_id=m.tool_call_id,
                name=m.name,
            )
        _add_tools(msg, req)
    elif req.prompt_token_ids is not None:
        msg.prompt_token_ids.ids.extend(req.prompt_token_ids)
    else:
        msg.prompt = req.prompt or ""
    return msg


# tool_choice -> what the tokenizer parses out of the text ("none" shows the model no tools).
_TOOL_PARSING = {
    "auto": tokenizer_pb2.TOOL_CALL_PARSING_MODEL_FORMAT,
    "required": tokenizer_pb2.TOOL_CALL_PARSING_JSON,
}


def _add_tools(msg: tokenizer_pb2.GenerateRequest, req: GenerationRequest) -> None:
    parsing = _TOOL_PARSING.get(req.tool_choice)
    if parsing is None:
        return
    msg.tool_call_parsing = parsing
    for tool in req.tools:
        msg.tools.add(name=tool.name, description=tool.description, parameters=tool.parameters)


def _logprob(lp: tokenizer_pb2.TextLogprob) -> TokenLogprob:
    top = [TopLogprob(t.token, t.token_bytes, t.logprob) for t in lp.top]
    return TokenLogprob(lp.token, lp.token_bytes, lp.logprob, top)


def _prompt_logprobs(out: tokenizer_pb2.GenerateOutput) -> list[TokenLogprob] | None:
    if not out.prompt_logprobs:
        return None
    logprobs = [_logprob(lp) for lp in out.prompt_logprobs]
    logprobs[0].logprob = None  # the first token: nothing before it predicts it
    return logprobs


def delta_from_proto(out: tokenizer_pb2.GenerateOutput, want_logprobs: bool) -> GenerationDelta:
    logprobs = [_logprob(lp) for lp in out.logprobs] if want_logprobs else None
    return GenerationDelta(
        text=out.text,
        token_ids=list(out.token_ids),
        logprobs=logprobs,
        finish_reason=_FINISH.get(out.finish_reason),
        prompt_tokens=out.prompt_tokens,
        completion_tokens=out.completion_tokens,
        cached_tokens=out.cached_tokens,
        model=out.model,
        tool_calls=[ToolCall(c.id, c.name, c.arguments, c.index) for c in out.tool_calls],
        prompt_text=out.prompt_text or None,
        prompt_logprobs=_prompt_logprobs(out),
        embedding=list(out.embedding) if out.embedding else None,
        stop_sequence=out.stop_sequence or None,
    )


class TokenizerBackend:
    def __init__(self, address: str) -> None:
        self._address = address
        self._channel = new_channel(address)
        self._stub = tokenizer_pb2_grpc.TokenizerStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._mux: MuxClient[tokenizer_pb2.GenerateRequest, tokenizer_pb2.GenerateOutput] = (
            MuxClient(
                MuxProtocol(
                    open_stream=self._stub.Session,
                    build_request=lambda reqs, aborts: tokenizer_pb2.SessionRequest(
                        requests=reqs, aborts=aborts
                    ),
                    outputs_of=lambda response: response.outputs,
                    request_id_of=lambda output: output.request_id,
                    is_final=lambda o: o.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED,
                    peer="tokenizer service",
                )
            )
        )

    async def readiness(self, timeout: float = 1.0) -> str | None:
        """Why the tokenizer service cannot serve now (asked with a health check), or None."""
        request = health_pb2.HealthCheckRequest(service=service_name(tokenizer_pb2, "Tokenizer"))
        try:
            response = await self._health.Check(request, timeout=timeout)
        except grpc.aio.AioRpcError as err:
            return f"the tokenizer service at {self._address} is unreachable ({err.code().name})"
        if response.status != SERVING:
            return (
                f"the tokenizer service at {self._address} is not serving: it has no serving "
                "scheduler (which needs a live worker), or it is shutting down"
            )
        return None

    async def close(self) -> None:
        await self._mux.close()
        await self._channel.close()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        queue: asyncio.Queue = asyncio.Queue()
        span = request_span.start_choice(request)  # None: not traced here
        message = request_to_proto(request, tracing.forward(span, request.trace_context))
        self._mux.submit(request.request_id, message, queue.put_nowait)
        want_logprobs = request.sampling.logprobs is not None
        finished = False
        outcome: BaseException | str | None = "cancelled"  # until the last output comes
        try:
            while True:
                item = await queue.get()
                if item is None:
                    finished = True
                    return
                if isinstance(item, LayerserveError):
                    finished = True
                    outcome = item
                    raise item
                if item.finish_reason == common_pb2.FINISH_REASON_ERROR:
                    finished = True
                    outcome = error_from_code(item.error.code, item.error.message, item.error.param)
                    raise outcome
                if item.finish_reason != common_pb2.FINISH_REASON_UNSPECIFIED:
                    outcome = None
                    request_span.choice_finished(span, item)
                yield delta_from_proto(item, want_logprobs)
        finally:
            if not finished:
                self._mux.abort(request.request_id)
            tracing.finish(span, outcome)

    async def list_models(self) -> list[ModelCard]:
        try:
            response = await self._stub.ListModels(tokenizer_pb2.ListModelsRequest(), timeout=10)
        except Exception as err:  # grpc.aio.AioRpcError and friends
            raise Unavailable(f"the tokenizer service is unavailable: {err}") from None
        return [ModelCard(id=m.id, max_model_len=m.max_model_len) for m in response.models]
