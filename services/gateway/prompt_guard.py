"""Refusing a prompt that cannot fit before the stack spends a tokenizer thread on it.

With LAYERSERVE_MAX_PROMPT_TOKENS set, request_validator refuses such a prompt while parsing.
Without it the limit is the model's context length, which only the stack knows: the gateway
asks the backend's model list (cached for a few seconds) and applies the same byte bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from services.gateway.backend import Backend, GenerationRequest
from services.gateway.prompt_size import check_prompt_size, pieces, prompt_texts
from services.gateway.request_limits import RequestLimits

log = logging.getLogger(__name__)

CONTEXT_LENGTHS_TTL_S = 10.0


class PromptGuard:
    def __init__(
        self,
        backend: Backend,
        limits: RequestLimits,
        *,
        ttl: float = CONTEXT_LENGTHS_TTL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._limits = limits
        self._ttl = ttl
        self._clock = clock
        self._lengths: dict[str, int] = {}
        self._fetched = -float("inf")

    async def check(self, request: GenerationRequest) -> None:
        """Raises InvalidArgument when the prompt's bytes (tools and tool calls included)
        cannot fit the model's context."""
        if self._limits.max_prompt_tokens or request.prompt_token_ids is not None:
            return  # checked while parsing, exactly
        per_token = self._limits.max_bytes_per_token
        if sum(map(len, prompt_texts(request))) + pieces(request) * per_token <= per_token:
            return  # fits any context of at least one token
        context = await self._context_length(request.model)
        if context:
            check_prompt_size(request, context, self._limits)

    async def _context_length(self, model: str) -> int:
        """The model's max_model_len; 0 when unknown (an alias, the stack unreachable)."""
        if self._clock() - self._fetched > self._ttl:
            try:
                cards = await self._backend.list_models()
            except Exception as err:  # the stack answers for itself once the request is sent
                log.debug("cannot list models to bound prompts: %s", err)
                return 0
            self._lengths = {card.id: card.max_model_len for card in cards}
            self._fetched = self._clock()
        return self._lengths.get(model, 0)
