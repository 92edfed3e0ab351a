"""Reading an SSE response the way an OpenAI client does, for the tests."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import ClientResponse

DONE = "[DONE]"


async def read_events(response: ClientResponse) -> list[Any]:
    """Every `data:` payload, decoded; the literal "[DONE]" stays a string."""
    body = (await response.read()).decode()
    assert body.endswith("\n\n"), body[-200:]
    events: list[Any] = []
    for block in body.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == DONE else json.loads(data))
    return events
