"""Request migration: a request whose scheduler replica is lost mid-stream continues on
another one, and the client sees neither an error nor a repeated or missing token.

The tokenizer holds what it needs: each request's Submit and the tokens already sent on. When
the replica's session stream breaks (it was killed, or its connection died), or the replica
answers UNAVAILABLE (it has no worker left for the model), the request is submitted again to
another replica with its prompt followed by the tokens already produced, `max_tokens` less
those, and `resumed_output_tokens` saying how many of the prompt's last tokens are output, so
the worker's sampler counts its position (seeded sampling resumes from (seed, position)),
penalties and structured outputs see them as output. Greedy and seeded requests then end with
exactly the tokens of an uninterrupted run. At most `max_migrations` moves per request, the
schedulers' moves between workers included (RequestOutput.migrations); then,
or when no other replica serves the model (within WAIT_FOR_REPLICA_S, while the lost one's
workers move), the request ends with UNAVAILABLE naming why.
"""

from __future__ import annotations

import asyncio
import logging

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from services.common.errors import LayerserveError, Unavailable, code_number
from services.tokenizer.output_sink import OutputSink
from services.tokenizer.request_events import RequestListener
from services.tokenizer.scheduler_link import SchedulerLink
from services.tokenizer.scheduler_pool import SchedulerPool

log = logging.getLogger(__name__)

DEFAULT_MAX_MIGRATIONS = 3
# How long a moving request waits for another replica to serve its model (a lost scheduler's
# workers register with the others within seconds), checking every RETRY_S.
WAIT_FOR_REPLICA_S = 15.0
RETRY_S = 0.25
_UNAVAILABLE = code_number(Unavailable(""))
_ERROR = common_pb2.FINISH_REASON_ERROR
_UNSPECIFIED = common_pb2.FINISH_REASON_UNSPECIFIED


class MigratingSink:
    """The session stream's sink for one request (mux.py): outputs go on to the OutputSink,
    their tokens counted; a lost replica starts a move instead of an error."""

    __slots__ = (
        "submit",
        "sink",
        "pool",
        "link",
        "events",
        "max_migrations",
        "produced",
        "moves",
        "_tried",
    )

    def __init__(
        self,
        submit: scheduler_pb2.Submit,
        sink: OutputSink,
        pool: SchedulerPool,
        link: SchedulerLink,
        events: RequestListener,
        max_migrations: int = DEFAULT_MAX_MIGRATIONS,
    ) -> None:
        self.submit = submit  # as first sent
        self.sink = sink
        self.pool = pool
        self.link = link  # the replica running it now
        self.events = events
        self.max_migrations = max_migrations
        self.produced: list[int] = []  # output token ids passed on so far
        self.moves = 0
        self._tried: set[str] = {link.address}

    def start(self) -> None:
        self.pool.submit(self.link, self.submit, self)

    def __call__(self, output) -> None:
        if output is None:
            self.sink(None)
            return
        if not isinstance(output, LayerserveError):
            # The scheduler's count includes its own moves between workers: each move counts
            # once against max_migrations, whichever tier made it.
            self.moves = max(self.moves, output.migrations)
        reason = _lost_reason(output)
        if reason is not None:
            self._move(reason, output)
            return
        if isinstance(output, LayerserveError) or output.finish_reason != _UNSPECIFIED:
            self.pool.ended(self.submit.request_id)
        if not isinstance(output, LayerserveError):
            self.produced.extend(output.token_ids)
        self.sink(output)

    def _move(self, reason: str, output) -> None:
        """Resubmits elsewhere, or ends the request with UNAVAILABLE naming why it cannot."""
        request_id = self.submit.request_id
        cause = output.message if isinstance(output, LayerserveError) else output.error.message
        if self.sink.stream.finished:
            self.pool.ended(request_id)
            return
        if self.moves >= self.max_migrations:
            self._fail(
                f"{_what(reason, self.link, cause)}, and it was moved {self.moves} times already "
                f"(the limit, --max-migrations)"
            )
            return
        asyncio.ensure_future(self._resubmit(reason, cause))

    async def _resubmit(self, reason: str, cause: str) -> None:
        request_id = self.submit.request_id
        lost = self.link
        waited = 0.0
        while True:
            try:
                link = await self.pool.choose(
                    self.submit.model, self._prompt(), frozenset(self._tried)
                )
                break
            except Unavailable:
                # Another replica may get the model's workers within seconds (they move when
                # theirs is gone): wait for it, as long as there is another at all.
                if waited >= WAIT_FOR_REPLICA_S or not self.pool.has_other(self._tried):
                    if self.pool.owns(request_id, lost):
                        self._fail(
                            f"{_what(reason, lost, cause)}, and no other scheduler replica "
                            f"serves model `{self.submit.model}`"
                        )
                    return
            await asyncio.sleep(RETRY_S)
            waited += RETRY_S
            if not self.pool.owns(request_id, lost):
                return  # aborted meanwhile
        if not self.pool.owns(request_id, lost):
            return  # aborted meanwhile
        self.moves += 1
        self._tried.add(link.address)
        self.link = link
        log.warning(
            "request %s: %s; moved to the scheduler at %s after %d tokens (move %d)",
            request_id,
            _what(reason, lost, cause),
            link.address,
            len(self.produced),
            self.moves,
        )
        self.events.migrated(request_id, self.submit.model, reason, len(self.produced))
        self.pool.submit(link, self.resumed(), self)

    def resumed(self) -> scheduler_pb2.Submit:
        """The Submit that continues the request after the tokens already produced."""
        msg = scheduler_pb2.Submit()
        msg.CopyFrom(self.submit)
        msg.prompt_token_ids.extend(self.produced)
        msg.resumed_output_tokens = len(self.produced)
        msg.migrations = self.moves
        if msg.max_tokens:
            msg.max_tokens = max(1, msg.max_tokens - len(self.produced))
        return msg

    def _prompt(self) -> list[int]:
        return [*self.submit.prompt_token_ids, *self.produced]

    def _fail(self, message: str) -> None:
        self.pool.ended(self.submit.request_id)
        log.warning("request %s: %s", self.submit.request_id, message)
        self.sink(Unavailable(message))


def _lost_reason(output) -> str | None:
    """Why the output means the replica lost the request (a reason label), or None."""
    if isinstance(output, Unavailable):
        return "scheduler_lost"  # its session stream broke
    if isinstance(output, LayerserveError):
        return None
    if output.finish_reason == _ERROR and output.error.code == _UNAVAILABLE:
        return "scheduler_unavailable"
    return None


def _what(reason: str, link: SchedulerLink, cause: str) -> str:
    if reason == "scheduler_lost":
        return f"lost the scheduler at {link.address}"
    return f"the scheduler at {link.address} could not serve it ({cause})"
