"""What happens to a request in the tokenizer, told to whoever listens: tracing
(request_trace.py) and metrics (tokenize_metrics.py), as BlockPool tells its cache events. The
session code only emits; each listener keeps its own state, by request id.

One request's events, in order: `started`, `prompt_encoded` (once per tokenizer that encodes
its prompt), `tokenized`, `submitting`, then per output `detokenizing`/`detokenized` (and
`migrated` whenever it moves to another scheduler replica), and one end: `finished`,
`failed` or `aborted` (an abort may also come while it is being tokenized, or after it
ended).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from layerserve.scheduler.v1.scheduler_pb2 import Submit
    from layerserve.tokenizer.v1.tokenizer_pb2 import GenerateOutput, GenerateRequest


class RequestListener:
    """Every event, doing nothing: a listener overrides those it needs. Called inline on the
    event loop: a listener must not block."""

    __slots__ = ()

    def started(self, request: GenerateRequest) -> None:
        """A request arrived on a session; its prompt is being tokenized."""

    def prompt_encoded(self, model: str, seconds: float) -> None:
        """A prompt was encoded with `model`'s tokenizer, in `seconds` with the wait for a
        thread (an alias's length route encodes with several; Tokenize calls count too)."""

    def tokenized(self, request_id: str, target: str, num_prompt_tokens: int) -> None:
        """Its prompt is tokens for `target` (an alias's pick); also when it was aborted
        meanwhile."""

    def submitting(self, request_id: str, submit: Submit) -> None:
        """It goes to the scheduler as `submit`, whose `trace` a listener may fill in."""

    def migrated(self, request_id: str, model: str, reason: str, tokens_done: int) -> None:
        """Its scheduler replica lost it (`reason`: scheduler_lost, scheduler_unavailable):
        it was submitted again to another, after the `tokens_done` output tokens sent."""

    def detokenizing(self, request_id: str) -> None:
        """An output's ids are about to become text (the first time: its first text)."""

    def detokenized(self, request_id: str) -> None:
        """That output's text is ready."""

    def finished(self, request_id: str, last: GenerateOutput) -> None:
        """Its last output went out (end of sequence, max tokens or a stop string)."""

    def failed(self, request_id: str, error: BaseException) -> None:
        """It ended with `error`: tokenizing failed, or the scheduler's answer did."""

    def aborted(self, request_id: str) -> None:
        """The gateway gave up on it, or its session closed."""


NO_LISTENER = RequestListener()


class RequestEvents(RequestListener):
    """Tells each event to every listener, in order."""

    __slots__ = ("_listeners",)

    def __init__(self, listeners: Iterable[RequestListener]) -> None:
        self._listeners = tuple(listeners)

    def started(self, request: GenerateRequest) -> None:
        for listener in self._listeners:
            listener.started(request)

    def prompt_encoded(self, model: str, seconds: float) -> None:
        for listener in self._listeners:
            listener.prompt_encoded(model, seconds)

    def tokenized(self, request_id: str, target: str, num_prompt_tokens: int) -> None:
        for listener in self._listeners:
            listener.tokenized(request_id, target, num_prompt_tokens)

    def submitting(self, request_id: str, submit: Submit) -> None:
        for listener in self._listeners:
            listener.submitting(request_id, submit)

    def migrated(self, request_id: str, model: str, reason: str, tokens_done: int) -> None:
        for listener in self._listeners:
            listener.migrated(request_id, model, reason, tokens_done)

    def detokenizing(self, request_id: str) -> None:
        for listener in self._listeners:
            listener.detokenizing(request_id)

    def detokenized(self, request_id: str) -> None:
        for listener in self._listeners:
            listener.detokenized(request_id)

    def finished(self, request_id: str, last: GenerateOutput) -> None:
        for listener in self._listeners:
            listener.finished(request_id, last)

    def failed(self, request_id: str, error: BaseException) -> None:
        for listener in self._listeners:
            listener.failed(request_id, error)

    def aborted(self, request_id: str) -> None:
        for listener in self._listeners:
            listener.aborted(request_id)
