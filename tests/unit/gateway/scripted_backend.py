"""A backend standing in for the model in the API tests (Responses, Anthropic Messages, tools):
it answers with scripted text pieces and tool calls and records what the gateway asked."""

from __future__ import annotations

from collections.abc import AsyncIterator

from services.common.errors import NotFound
from services.gateway.backend import GenerationDelta, GenerationRequest, ModelCard, ToolCall

MODEL = "scripted-1"
PROMPT_TOKENS = 7
CACHED_TOKENS = 2

Script = list[str | ToolCall]


class ScriptedBackend:
    """Answers each request with the next of `scripts`, else with `script` (default "ok");
    each step is one delta, the last one finishing with `finish` (and `stop_sequence`). Knows
    one model."""

    def __init__(self) -> None:
        self.requests: list[GenerationRequest] = []
        self.scripts: list[Script] = []
        self.script: Script = ["ok"]
        self.finish = "stop"
        self.stop_sequence: str | None = None  # the stop string said to have ended it

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        self.requests.append(request)
        if request.model != MODEL:
            raise NotFound(f"model {request.model!r} does not exist", param="model")
        script = self.scripts.pop(0) if self.scripts else self.script
        for i, step in enumerate(script):
            last = i == len(script) - 1
            text, calls = (step, []) if isinstance(step, str) else ("", [step])
            yield GenerationDelta(
                text=text,
                token_ids=[i],
                finish_reason=self.finish if last else None,
                prompt_tokens=PROMPT_TOKENS,
                completion_tokens=i + 1,
                cached_tokens=CACHED_TOKENS,
                model=MODEL,
                tool_calls=calls,
                stop_sequence=self.stop_sequence if last else None,
            )

    async def list_models(self) -> list[ModelCard]:
        return [ModelCard(id=MODEL, max_model_len=2048)]
