"""The Anthropic Messages and Responses APIs leave the sampling fields a client left out unset,
so the serving model's recommended values apply to them (README "Model defaults"), as on chat
completions; a value the client gives is kept. The tokenizer applies the defaults: here the
gateway's request to it is checked."""

from __future__ import annotations

import pytest

from tests.unit.gateway.conftest import API_KEY
from tests.unit.gateway.scripted_backend import MODEL

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
USER = [{"role": "user", "content": "Hi"}]
MESSAGES = ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": USER})
RESPONSES = ("/v1/responses", {"model": MODEL, "input": "Hi", "store": False})


@pytest.mark.parametrize(("path", "body"), [MESSAGES, RESPONSES], ids=["messages", "responses"])
async def test_left_out_sampling_fields_get_the_models_defaults(http, scripted, path, body) -> None:
    response = await http.post(path, json=body, headers=HEADERS)
    assert response.status == 200, await response.text()
    unset = scripted.requests[-1].sampling_unset
    assert {"temperature", "top_p", "top_k"} <= set(unset)


@pytest.mark.parametrize(("path", "body"), [MESSAGES, RESPONSES], ids=["messages", "responses"])
async def test_given_sampling_fields_are_kept(http, scripted, path, body) -> None:
    given = {**body, "temperature": 0.5, "top_p": 0.8, "top_k": 7}
    response = await http.post(path, json=given, headers=HEADERS)
    assert response.status == 200, await response.text()
    request = scripted.requests[-1]
    assert not {"temperature", "top_p", "top_k"} & set(request.sampling_unset)
    assert (request.sampling.temperature, request.sampling.top_p) == (0.5, 0.8)
    assert request.sampling.top_k == 7


async def test_a_response_echoes_null_for_what_the_model_chose(http) -> None:
    path, body = RESPONSES
    left_out = await (await http.post(path, json=body, headers=HEADERS)).json()
    assert left_out["temperature"] is None and left_out["top_p"] is None
    given = {**body, "temperature": 0.5}
    echoed = await (await http.post(path, json=given, headers=HEADERS)).json()
    assert echoed["temperature"] == 0.5 and echoed["top_p"] is None
