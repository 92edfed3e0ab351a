"""A request that sets no max_tokens gets the gateway's default completion length, or fewer
when its prompt leaves less room than that in the model's context (as vLLM and TGI do).

Only the stack knows the prompt's length in tokens, so the default goes down as an explicit
max_tokens; when the prompt leaves less room, the scheduler refuses it before producing
anything (an InvalidArgument about max_tokens: the field name is all that crosses the wire,
and the client set none), and the request is sent again with 0, "as many as fit", which is then
fewer than the default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

from services.common.errors import InvalidArgument
from services.gateway.backend import Backend, GenerationDelta, GenerationRequest, ModelCard


class DefaultLengthBackend:
    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        deltas = self._backend.generate(request)
        try:
            produced = False
            try:
                async for delta in deltas:
                    produced = True
                    yield delta
                return
            except InvalidArgument as err:
                if produced or not request.max_tokens_is_default or not _about_max_tokens(err):
                    raise
        finally:
            await deltas.aclose()
        fitting = replace(request, max_tokens=0, max_tokens_is_default=False)
        deltas = self._backend.generate(fitting)
        try:
            async for delta in deltas:
                yield delta
        finally:
            await deltas.aclose()

    async def list_models(self) -> list[ModelCard]:
        return await self._backend.list_models()


def _about_max_tokens(err: InvalidArgument) -> bool:
    return err.param == "max_tokens" or "max_tokens" in err.message
