"""The official openai SDK against the front end: it must parse what we send."""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
from aiohttp.test_utils import TestClient

from tests.unit.gateway.conftest import API_KEY
from tests.unit.gateway.echo_backend import MODEL

MESSAGES = [{"role": "user", "content": "hello from the sdk"}]


@pytest.fixture
async def sdk(auth_client: TestClient) -> AsyncIterator[openai.AsyncOpenAI]:
    base_url = str(auth_client.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY, max_retries=0) as client:
        yield client


async def test_chat_completion(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, n=2, seed=1)
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "from the sdk hello"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens == 4 + 8
    assert completion.usage.prompt_tokens_details is not None


async def test_chat_completion_stream(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        stream=True,
        stream_options={"include_usage": True},
        logprobs=True,
        top_logprobs=2,
    )
    text, finish, usage, tokens = "", None, None, []
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            if choice.logprobs is not None:
                tokens += [lp.token for lp in choice.logprobs.content or []]
    assert text == "hello from the sdk" and finish == "stop"
    assert "".join(tokens) == text
    assert usage is not None and usage.completion_tokens == 4


async def test_completion(sdk: openai.AsyncOpenAI) -> None:
    completion = await sdk.completions.create(model=MODEL, prompt="one two three", max_tokens=2)
    assert completion.choices[0].text == "one two"
    assert completion.choices[0].finish_reason == "length"
    stream = await sdk.completions.create(model=MODEL, prompt=[11, 12], max_tokens=5, stream=True)
    assert "".join([c.choices[0].text async for c in stream]) == "t11 t12"


async def test_errors_become_sdk_exceptions(sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        await sdk.completions.create(model="nope", prompt="x")
    with pytest.raises(openai.BadRequestError) as info:
        await sdk.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=5)
    assert info.value.param == "temperature"
    bad = openai.AsyncOpenAI(base_url=str(sdk.base_url), api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as auth:
        await bad.models.list()
    assert auth.value.code == "invalid_api_key"
    await bad.close()


async def test_models(sdk: openai.AsyncOpenAI) -> None:
    models = await sdk.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (await sdk.models.retrieve(MODEL)).id == MODEL
