"""Prompt and completion logging, for operators who turn it on (LAYERSERVE_LOG_PROMPTS=1).

Off by default: no other log line in the stack carries prompt or completion text.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from services.gateway.backend import Backend, GenerationDelta, GenerationRequest, ModelCard

log = logging.getLogger(__name__)


class PromptLoggingBackend:
    """Logs each request's prompt as it starts and its text as it ends."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        log.info("request %s: prompt %r", request.request_id, _prompt_of(request))
        pieces: list[str] = []
        deltas = self._backend.generate(request)
        try:
            async for delta in deltas:
                pieces.append(delta.text)
                yield delta
        finally:
            await deltas.aclose()
            log.info("request %s: completion %r", request.request_id, "".join(pieces))

    async def list_models(self) -> list[ModelCard]:
        return await self._backend.list_models()


def _prompt_of(request: GenerationRequest) -> object:
    if request.messages is not None:
        return [(m.role, m.content) for m in request.messages]
    if request.prompt_token_ids is not None:
        return request.prompt_token_ids
    return request.prompt
