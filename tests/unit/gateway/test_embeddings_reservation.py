"""An embedding generates nothing, so a key's token budget reserves and spends its prompt tokens
alone: a key allowed 12 tokens a minute embeds 12 prompt tokens once, and not twice."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp.test_utils import TestClient, TestServer

from services.gateway.api_keys import KeyLimits
from services.gateway.backend import GenerationDelta, GenerationRequest, ModelCard
from services.gateway.http_app import create_app
from tests.unit.gateway.conftest import API_KEY, front_door

MODEL = "m"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
INPUTS = [[11, 12, 13, 14]] * 3  # token ids: the reservation's estimate is exact


class PoolingBackend:
    """Answers as the stack does for an embedding: its vector and no token."""

    async def list_models(self) -> list[ModelCard]:
        return [ModelCard(id=MODEL, max_model_len=2048)]

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationDelta]:
        size = len(request.prompt_token_ids or [])
        yield GenerationDelta(
            "", [], finish_reason="stop", prompt_tokens=size, model=MODEL, embedding=[1.0, 0.0]
        )


async def test_a_key_budget_pays_for_the_prompt_tokens_alone() -> None:
    door = front_door(API_KEY, limits=KeyLimits(tokens_per_minute=12))
    app = create_app(PoolingBackend(), front_door=door)  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as client:
        body = {"model": MODEL, "input": INPUTS}
        first = await client.post("/v1/embeddings", json=body, headers=AUTH)
        assert first.status == 200, await first.text()
        assert (await first.json())["usage"] == {"prompt_tokens": 12, "total_tokens": 12}
        usage = await (await client.get("/v1/usage", headers=AUTH)).json()
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (12, 0)
        again = await client.post("/v1/embeddings", json=body, headers=AUTH)
        assert again.status == 429  # the minute's 12 tokens are spent
