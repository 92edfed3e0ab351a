"""How many tokens a request may generate: the one form max_tokens takes in every service.

A client's own max_tokens is strict: when the prompt leaves less room than that in the model's
context (or the worker's KV cache), the request is refused with an error naming max_tokens. A
length the gateway chose for a client that set none is a cap: admission lowers it to what fits
(vLLM and TGI do the same with their defaults). Only the scheduler knows the prompt's length in
tokens and the model's limits, so admission resolves it, once (scheduler/admission.py); on the
internal wire it is max_tokens plus max_tokens_is_cap.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MaxTokens:
    limit: int = 0  # 0: as many as fit
    is_cap: bool = False  # True: admission may lower limit to what fits

    @classmethod
    def cap(cls, limit: int) -> MaxTokens:
        """At most `limit` tokens, fewer when the prompt leaves less room."""
        return cls(limit, is_cap=True)

    def resolve(self, room: int) -> int:
        """The tokens to generate when `room` are left after the prompt. A strict limit comes
        back as is, even over room: the caller refuses it, naming max_tokens."""
        if not self.limit:
            return room
        return min(self.limit, room) if self.is_cap else self.limit
