"""The tokenizer's side of one request: the scheduler's token outputs in, text outputs out."""

from __future__ import annotations

from typing import Protocol

from layerserve.common.v1 import common_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2
from services.common.errors import LayerserveError, code_number, error_from_code
from services.common.mux import Outbox
from services.tokenizer.request_events import NO_LISTENER, RequestListener
from services.tokenizer.text_stream import TextStream
from services.tokenizer.tool_parser import ParsedText, ToolCallParser

GenerateOutput = tokenizer_pb2.GenerateOutput
_UNSPECIFIED = common_pb2.FINISH_REASON_UNSPECIFIED


class Aborter(Protocol):
    """Cancels a request upstream (the scheduler pool: on whichever replica runs it)."""

    def abort(self, request_id: str) -> None: ...


def error_output(request_id: str, err: LayerserveError) -> GenerateOutput:
    return GenerateOutput(
        request_id=request_id,
        finish_reason=common_pb2.FINISH_REASON_ERROR,
        error=common_pb2.Status(code=code_number(err), message=err.message, param=err.param or ""),
    )


class OutputSink:
    """Receives one request's outputs from the scheduler (inline, on the reading task)."""

    __slots__ = (
        "request_id",
        "model_name",
        "stream",
        "outbox",
        "open_ids",
        "mux",
        "events",
        "tool_parser",
        "echo_text",
        "first_prompt_token",
    )

    def __init__(
        self,
        request_id: str,
        model_name: str,
        stream: TextStream,
        outbox: Outbox,
        open_ids: set[str],
        mux: Aborter,
        events: RequestListener = NO_LISTENER,
        tool_parser: ToolCallParser | None = None,  # None: all text is content
        echo_text: str | None = None,  # the prompt's text, for the first output (echo)
        first_prompt_token: int = -1,  # the prompt's first token, when prompt logprobs are asked
    ) -> None:
        self.request_id = request_id
        self.model_name = model_name  # the model serving it (an alias's target)
        self.stream = stream
        self.outbox = outbox
        self.open_ids = open_ids
        self.mux = mux
        self.events = events
        self.tool_parser = tool_parser
        self.echo_text = echo_text
        self.first_prompt_token = first_prompt_token

    def __call__(self, output) -> None:
        if output is None or self.stream.finished:
            return
        if isinstance(output, LayerserveError):  # the scheduler stream broke
            self._end(error_output(self.request_id, output), output)
            return
        if output.finish_reason == common_pb2.FINISH_REASON_ERROR:
            self._end(
                GenerateOutput(
                    request_id=self.request_id,
                    finish_reason=output.finish_reason,
                    error=output.error,
                    model=self.model_name,
                ),
                error_from_code(output.error.code, output.error.message),
            )
            return
        last = output.finish_reason != _UNSPECIFIED
        self.events.detokenizing(self.request_id)
        delta = self.stream.add(list(output.token_ids), last)
        self.events.detokenized(self.request_id)
        finish = output.finish_reason
        if delta.stopped:
            finish = common_pb2.FINISH_REASON_STOP
            if not last:
                self.mux.abort(self.request_id)  # free its KV now, not at max_tokens
        parsed = self._parse(delta.text)
        out = GenerateOutput(
            request_id=self.request_id,
            text=parsed.content,
            token_ids=output.token_ids,
            finish_reason=finish,
            prompt_tokens=self.stream.prompt_tokens,
            completion_tokens=self.stream.completion_tokens,
            cached_tokens=output.cached_tokens,
            model=self.model_name,
            stop_sequence=self.stream.stop.matched if delta.stopped else "",
        )
        for call in parsed.tool_calls:
            out.tool_calls.add(
                index=call.index, id=call.id, name=call.name, arguments=call.arguments
            )
        for lp in output.logprobs:
            out.logprobs.append(self._text_logprob(lp))
        self._add_prompt(out, output.prompt_logprobs)
        out.embedding.extend(output.embedding)
        self.outbox.put(out)
        if self.stream.finished:
            self.open_ids.discard(self.request_id)
            self.events.finished(self.request_id, out)

    def _parse(self, text: str) -> ParsedText:
        """Content and tool calls of the new text; all of what is held back at the end."""
        if self.tool_parser is None:
            return ParsedText(text)
        parsed = self.tool_parser.feed(text)
        if self.stream.finished:
            rest = self.tool_parser.flush()
            parsed.content += rest.content
            parsed.tool_calls += rest.tool_calls
        return parsed

    def _add_prompt(self, out: GenerateOutput, prompt_logprobs) -> None:
        """The echoed prompt and the prompt logprobs, once: a request that moved to another
        scheduler replica gets its prompt logprobs again there."""
        if self.echo_text is not None:
            out.prompt_text, self.echo_text = self.echo_text, None
        if self.first_prompt_token >= 0:  # a one-token prompt has only this entry
            first = common_pb2.TokenLogprob(token_id=self.first_prompt_token)
            out.prompt_logprobs.append(self._text_logprob(first))
            for lp in prompt_logprobs:
                out.prompt_logprobs.append(self._text_logprob(lp))
            self.first_prompt_token = -1

    def _text_logprob(self, lp: common_pb2.TokenLogprob) -> tokenizer_pb2.TextLogprob:
        model = self.stream.model
        msg = tokenizer_pb2.TextLogprob(
            token=model.token_text(lp.token_id),
            token_bytes=model.token_bytes(lp.token_id),
            logprob=lp.logprob,
        )
        for top in lp.top:
            msg.top.add(
                token=model.token_text(top.token_id),
                token_bytes=model.token_bytes(top.token_id),
                logprob=top.logprob,
            )
        return msg

    def _end(self, out: GenerateOutput, error: LayerserveError) -> None:
        self.stream.finished = True
        self.open_ids.discard(self.request_id)
        self.outbox.put(out)
        self.events.failed(self.request_id, error)
