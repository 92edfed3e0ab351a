"""Who is asking travels with the request (as a non-secret id), and a full queue says when to
come back."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from services.gateway.http_app import create_app
from tests.openai_schema import validate
from tests.unit.gateway.conftest import API_KEY, front_door
from tests.unit.gateway.echo_backend import MODEL, EchoBackend


async def test_requests_carry_a_tenant_id_that_is_not_the_key(auth_client, backend):
    body = {"model": MODEL, "prompt": "one two", "max_tokens": 1}
    response = await auth_client.post(
        "/v1/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    )
    assert response.status == 200
    tenant = backend.requests[-1].tenant
    assert tenant.startswith("key-") and API_KEY not in tenant


async def test_two_keys_are_two_tenants():
    backend = EchoBackend()
    app = create_app(backend, front_door=front_door("key-a", "key-b"))
    body = {"model": MODEL, "prompt": "one", "max_tokens": 1}
    async with TestClient(TestServer(app)) as client:
        for key in ("key-a", "key-b", "key-a"):
            response = await client.post(
                "/v1/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            assert response.status == 200
    a1, b, a2 = (r.tenant for r in backend.requests)
    assert a1 == a2 and a1 != b


async def test_a_full_queue_is_429_with_retry_after(client: TestClient):
    for stream in (False, True):
        body = {"model": MODEL, "prompt": "busy day", "max_tokens": 2, "stream": stream}
        response = await client.post("/v1/completions", json=body)
        assert response.status == 429
        assert int(response.headers["Retry-After"]) >= 1
        validate(await response.json(), "ErrorResponse")
