"""A deterministic in-process Backend for the HTTP front end's tests.

It answers with the words of the prompt, one word per token: all of them then "stop", or
max_tokens of them (cycling, with ignore_eos) then "length". A seed rotates the words, so n
choices with distinct seeds differ. Failures as the real stack reports them: NotFound for an
unknown model and InvalidArgument for an over-long prompt on the first __anext__,
ResourceExhausted (a full queue) for a prompt starting with "busy", Unavailable mid-stream when
the word "boom" comes up.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from services.common.errors import InvalidArgument, NotFound, ResourceExhausted, Unavailable
from services.gateway.backend import (
    GenerationDelta,
    GenerationRequest,
    ModelCard,
    TokenLogprob,
    TopLogprob,
)

MODEL = "echo-1"
MAX_PROMPT_WORDS = 64
CACHED_TOKENS = 1  # reported on every delta, to see prompt_tokens_details carried through


class EchoBackend:
    def __init__(self, token_delay: float = 0.0) -> None:
        self.token_delay = token_delay
        self.requests: list[GenerationRequest] = []
        self.aborted: list[str] = []  # ids closed (aclose) before their final delta
        self.finalized: list[str] = []  # ids whose generator body has exited, however

    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        self.requests.append(request)
        return _Tracked(self._generate(request), lambda: self.aborted.append(request.request_id))

    async def list_models(self) -> list[ModelCard]:
        return [ModelCard(id=MODEL, max_model_len=2048, created=1700000000)]

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        try:
            await asyncio.sleep(0)  # like the real one: errors come from the first __anext__
            words = _checked_prompt_words(request)
            if words[0] == "busy":
                raise ResourceExhausted("the queue is full; retry shortly")
            count, finish = _plan(request, len(words))
            for i in range(count):
                word = words[i % len(words)]
                if word == "boom":
                    raise Unavailable("the worker went away")
                if word in request.stop:  # the stop string itself is not part of the output
                    yield _delta(request, "", i, len(words), True, "stop")
                    return
                if self.token_delay:
                    await asyncio.sleep(self.token_delay)
                last = i + 1 >= count
                yield _delta(request, word if i == 0 else " " + word, i, len(words), last, finish)
        finally:
            self.finalized.append(request.request_id)


class _Tracked:
    """Wraps the generator to record an early aclose(), the Backend's abort signal."""

    def __init__(self, inner: AsyncIterator[GenerationDelta], on_abort: Callable[[], None]):
        self._inner = inner
        self._on_abort = on_abort
        self._done = False

    def __aiter__(self) -> _Tracked:
        return self

    async def __anext__(self) -> GenerationDelta:
        delta = await self._inner.__anext__()
        self._done = delta.finish_reason is not None
        return delta

    async def aclose(self) -> None:
        if not self._done:
            self._on_abort()
        await self._inner.aclose()  # type: ignore[attr-defined]


def _checked_prompt_words(request: GenerationRequest) -> list[str]:
    if request.model != MODEL:
        raise NotFound(f"model {request.model!r} does not exist", param="model")
    if request.messages is not None:
        words = " ".join(m.content for m in request.messages).split()
    elif request.prompt_token_ids is not None:
        words = [f"t{token}" for token in request.prompt_token_ids]
    else:
        words = (request.prompt or "").split()
    if len(words) > MAX_PROMPT_WORDS:
        param = "messages" if request.messages is not None else "prompt"
        raise InvalidArgument(f"prompt is too long: {len(words)} tokens", param=param)
    words = words or ["empty"]
    shift = (request.sampling.seed or 0) % len(words)
    return words[shift:] + words[:shift]


def _plan(request: GenerationRequest, n_words: int) -> tuple[int, str]:
    limit = request.max_tokens.limit
    if limit and (limit < n_words or request.ignore_eos):
        return limit, "length"
    return n_words, "stop"


def _delta(
    request: GenerationRequest, text: str, i: int, n_prompt: int, last: bool, finish: str
) -> GenerationDelta:
    logprobs = None
    if request.sampling.logprobs is not None and text:
        top = [TopLogprob(text, text.encode(), -0.25)]
        top += [TopLogprob(f"alt{k}", f"alt{k}".encode(), -1.0 - k) for k in range(1, 20)]
        logprobs = [TokenLogprob(text, text.encode(), -0.25, top[: request.sampling.logprobs])]
    return GenerationDelta(
        text=text,
        token_ids=[1000 + i] if text else [],
        logprobs=logprobs,
        finish_reason=finish if last else None,
        prompt_tokens=n_prompt,
        completion_tokens=i + 1 if text else i,
        cached_tokens=CACHED_TOKENS,
    )
