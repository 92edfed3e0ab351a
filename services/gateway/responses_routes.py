"""The Responses API's routes: POST /v1/responses, GET and DELETE /v1/responses/{id}."""

from __future__ import annotations

from aiohttp import web

from services.gateway.api_context import ApiAdapter, ApiContext
from services.gateway.http_json import json_response
from services.gateway.responses_call import parse_responses_call
from services.gateway.responses_store import ResponseStore

RESPONSES = web.AppKey("responses", ResponseStore)


def add_responses_routes(app: web.Application, store: ResponseStore, api: ApiAdapter) -> None:
    app[RESPONSES] = store
    app.router.add_post("/v1/responses", api(_create))
    app.router.add_get("/v1/responses/{response_id}", api(_get))
    app.router.add_delete("/v1/responses/{response_id}", api(_delete))


async def _create(request: web.Request, api: ApiContext) -> web.StreamResponse:
    store = request.app[RESPONSES]
    body = await api.read_body()
    call = await parse_responses_call(
        body, store, api.request_id, api.tenant, api.trace_context, api.limits
    )
    response = await api.serve(call.parsed, call.renderer)
    await call.keep(store, api.tenant)
    return response


async def _get(request: web.Request, api: ApiContext) -> web.Response:
    stored = await request.app[RESPONSES].get(request.match_info["response_id"], api.tenant)
    return json_response(stored.response)


async def _delete(request: web.Request, api: ApiContext) -> web.Response:
    response_id = request.match_info["response_id"]
    await request.app[RESPONSES].delete(response_id, api.tenant)
    return json_response({"id": response_id, "object": "response", "deleted": True})
