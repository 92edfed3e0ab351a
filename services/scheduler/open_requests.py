"""The requests open in this scheduler process, one record each: the session that submitted it
(where its outputs go) and the model serving it. A request leaves in one place (close()), which
also tells the router: whether it finished, was aborted by its client, or lost its session."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.common.mux import Outbox
from services.scheduler.router import Router


@dataclass(eq=False, slots=True)
class Session:
    """One Session stream: where its requests' outputs go, and which of them are open."""

    outbox: Outbox[Any]
    request_ids: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class OpenRequest:
    session: Session
    model: str  # the model it asked for (named in each of its outputs)


class OpenRequests:
    def __init__(self, router: Router) -> None:
        self._router = router
        self._open: dict[str, OpenRequest] = {}  # by request id

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._open

    def get(self, request_id: str) -> OpenRequest | None:
        return self._open.get(request_id)

    def open(self, request_id: str, session: Session, model: str) -> None:
        """Records a request before it is routed (its outputs may come at once)."""
        self._open[request_id] = OpenRequest(session, model)
        session.request_ids.add(request_id)

    def close(self, request_id: str, *, abort: bool) -> None:
        """Forgets the request. abort: its engine may still run it (its client aborted it, or
        its session ended), so stop it there; False: it finished, or was never queued."""
        record = self._open.pop(request_id, None)
        if record is None:
            return
        record.session.request_ids.discard(request_id)
        if abort:
            self._router.abort(request_id)
        else:
            self._router.forget(request_id)
