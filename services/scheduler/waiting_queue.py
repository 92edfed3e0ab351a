"""Requests waiting to start (new, or preempted and waiting to resume), in the order the
scheduler should start them.

Higher priority first. Within a priority, tenants share the engine: the next request comes
from the tenant with the fewest running requests (ties: the tenant whose oldest waiting request
arrived first), so a tenant that queued 100 requests cannot starve another's single one; each
tenant's own requests start in arrival order (a preempted request keeps its arrival, so it
resumes before its tenant's newer ones).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping

from services.scheduler.request import Request


def _arrival(request: Request) -> float:
    return request.arrival


class WaitingQueue:
    def __init__(self) -> None:
        # priority -> tenant -> that tenant's waiting requests, by arrival
        self._levels: dict[int, dict[str, list[Request]]] = {}
        self._size = 0
        # Those never started (not preempted ones), in arrival order: for never_started().
        self._never_started: dict[str, Request] = {}

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[Request]:
        for tenants in self._levels.values():
            for queue in tenants.values():
                yield from queue

    def add(self, request: Request) -> None:
        tenants = self._levels.setdefault(request.priority, {})
        bisect.insort(tenants.setdefault(request.tenant, []), request, key=_arrival)
        self._size += 1
        if not request.started:
            self._never_started[request.request_id] = request

    def remove(self, request: Request) -> None:
        tenants = self._levels[request.priority]
        queue = tenants[request.tenant]
        queue.remove(request)
        self._size -= 1
        self._never_started.pop(request.request_id, None)
        if not queue:
            del tenants[request.tenant]
            if not tenants:
                del self._levels[request.priority]

    def peek(self, running_per_tenant: Mapping[str, int]) -> Request | None:
        """The request to start next, given how many requests each tenant has running."""
        if not self._levels:
            return None
        tenants = self._levels[max(self._levels)]
        queue = min(
            tenants.values(),
            key=lambda q: (running_per_tenant.get(q[0].tenant, 0), q[0].arrival),
        )
        return queue[0]

    def never_started(self, arrived_by: float) -> list[Request]:
        """The requests that arrived at `arrived_by` or earlier and never started, oldest first
        (preempted ones have started)."""
        old = []
        for request in self._never_started.values():
            if request.arrival > arrived_by:
                break  # arrival order: the rest are younger
            old.append(request)
        return old
