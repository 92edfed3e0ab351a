"""Every request has an id, returned in X-Request-Id and found in the logs about it."""

from __future__ import annotations

import logging
import re

import pytest

from tests.unit.gateway.echo_backend import MODEL

BODY = {"model": MODEL, "prompt": "one two", "max_tokens": 2}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "one two"}]}


async def test_a_generated_id_is_the_response_id_and_prefixes_every_choice(client, backend):
    response = await client.post("/v1/completions", json={**BODY, "n": 2})
    body = await response.json()
    assert response.headers["X-Request-Id"] == body["id"]
    assert [r.request_id for r in backend.requests] == [f"{body['id']}-0", f"{body['id']}-1"]


async def test_the_clients_id_is_echoed_and_logged_with_the_response_id(client, caplog):
    caplog.set_level(logging.DEBUG, logger="services.gateway")
    headers = {"X-Request-Id": "trace-me-42"}
    response = await client.post("/v1/completions", json=BODY, headers=headers)
    assert response.headers["X-Request-Id"] == "trace-me-42"
    response_id = (await response.json())["id"]
    assert any("trace-me-42" in r.message and response_id in r.message for r in caplog.records)
    bad = await client.post("/v1/completions", json={**BODY, "n": 0}, headers=headers)
    assert bad.headers["X-Request-Id"] == "trace-me-42"
    assert any(
        "trace-me-42" in r.message and "InvalidArgument" in r.message for r in caplog.records
    )


@pytest.mark.parametrize(
    ("path", "body", "prefix"),
    [
        ("/v1/completions", BODY, "cmpl-"),
        ("/v1/chat/completions", CHAT, "chatcmpl-"),
        ("/v1/responses", {"model": MODEL, "input": "one two"}, "resp_"),
        ("/v1/messages", {**CHAT, "max_tokens": 2}, "msg_"),
    ],
)
async def test_every_api_names_its_response_after_the_one_id_minted_at_the_door(
    client, backend, path, body, prefix
):
    response = await client.post(path, json=body)
    assert response.status == 200, await response.text()
    response_id = (await response.json())["id"]
    assert response.headers["X-Request-Id"] == response_id
    assert re.fullmatch(re.escape(prefix) + "[0-9a-f]{32}", response_id)
    assert [r.request_id for r in backend.requests] == [f"{response_id}-0"]
