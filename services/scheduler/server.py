"""scheduler.v1.Scheduler over gRPC: sessions of many requests multiplexed on one stream."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.errors import InvalidArgument, LayerserveError, Unavailable, code_number
from services.common.max_tokens import MaxTokens
from services.common.mux import Outbox, session_batches
from services.common.sampling_proto import sampling_from_proto
from services.scheduler.alias_proto import alias_to_proto
from services.scheduler.aliases import AliasTable
from services.scheduler.open_requests import OpenRequests, Session
from services.scheduler.output import Output
from services.scheduler.output_proto import output_to_proto
from services.scheduler.request_trace import RequestTraces
from services.scheduler.router import Router
from services.scheduler.submission import Submission

log = logging.getLogger(__name__)

RequestOutput = scheduler_pb2.RequestOutput
_SHUTTING_DOWN = Unavailable("the scheduler is shutting down; retry shortly")


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self,
        router: Router,
        aliases: AliasTable | None = None,
        traces: RequestTraces | None = None,
    ) -> None:
        self._router = router
        self._aliases = aliases if aliases is not None else AliasTable()
        self._traces = traces if traces is not None else RequestTraces()
        self._requests = OpenRequests(router)
        self._sessions: set[Session] = set()
        self._draining = False

    def readiness(self) -> str | None:
        """None once a worker taking new requests is live (connected and SERVING), else why
        not."""
        engines = self._router.engines
        if any(engine.ready for engine in engines):
            return None
        if not engines:
            return "no workers (add one with the Admin API)"
        return "no live worker: " + "; ".join(engine.why_not_ready() for engine in engines)

    def stop_taking(self) -> None:
        """Drain: refuse new requests; each session ends once its requests have."""
        self._draining = True
        for session in self._sessions:
            session.outbox.wake()

    def emit(self, outputs: list[Output]) -> None:
        """Called by the engines after each step: route outputs to their sessions."""
        for output in outputs:
            record = self._requests.get(output.request_id)
            if record is None:
                continue
            msg = output_to_proto(output)
            msg.model = record.model
            record.session.outbox.put(msg)
            if output.finish_reason is not None:
                self._requests.close(output.request_id, abort=False)

    async def Session(
        self, request_iterator: AsyncIterator[scheduler_pb2.SessionRequest], context
    ) -> AsyncIterator[scheduler_pb2.SessionResponse]:
        session = Session(Outbox[RequestOutput]())
        reader = asyncio.ensure_future(self._read(request_iterator, session))
        self._sessions.add(session)
        try:
            async for batch in session_batches(
                session.outbox, reader, lambda: bool(session.request_ids), lambda: self._draining
            ):
                yield scheduler_pb2.SessionResponse(outputs=batch)
        finally:
            self._sessions.discard(session)
            reader.cancel()
            for request_id in list(session.request_ids):
                self._requests.close(request_id, abort=True)

    async def _read(self, request_iterator, session: Session) -> None:
        async for msg in request_iterator:
            for request_id in msg.aborts:
                self._requests.close(request_id, abort=True)
            for submit in msg.submits:
                self._submit(submit, session)

    def _submit(self, submit, session: Session) -> None:
        if submit.request_id in self._requests:
            session.outbox.put(_error(submit.request_id, InvalidArgument("duplicate request_id")))
            return
        if self._draining:
            session.outbox.put(_error(submit.request_id, _SHUTTING_DOWN))
            return
        self._requests.open(submit.request_id, session, submit.model)
        submission = submission_from_proto(submit)
        self._traces.start(submission)
        try:
            self._router.submit(submission)
        except LayerserveError as err:
            self._requests.close(submit.request_id, abort=False)
            session.outbox.put(_error(submit.request_id, err))
            self._traces.rejected(submit.request_id, err)

    async def GetStats(self, request, context) -> scheduler_pb2.SchedulerStats:
        stats = scheduler_pb2.SchedulerStats()
        for engine in self._router.all_engines:
            load, info = engine.load(), engine.info
            if load is None or info is None or (request.model and request.model != info.model):
                continue
            stats.workers.add(
                model=info.model,
                address=engine.address,
                num_blocks=load.num_blocks,
                free_blocks=load.free_blocks,
                running=load.num_running,
                waiting=load.num_waiting,
                steps=load.num_steps,
                preemptions=load.num_preemptions,
                prefix_query_tokens=load.prefix_query_tokens,
                prefix_hit_tokens=load.prefix_hit_tokens,
                rejected=load.num_rejected,
                expired=load.num_expired,
                block_size=info.block_size,
                model_fingerprint=info.model_fingerprint,
            )
        return stats

    async def ListModels(self, request, context) -> scheduler_pb2.ListModelsResponse:
        return scheduler_pb2.ListModelsResponse(
            models=[
                scheduler_pb2.ModelInfo(
                    id=m.name, max_model_len=m.max_model_len, path=m.path, replicas=m.replicas
                )
                for m in self._router.models()
            ],
            aliases=[alias_to_proto(alias) for alias in self._aliases.list()],
        )


def submission_from_proto(msg: scheduler_pb2.Submit) -> Submission:
    return Submission(
        request_id=msg.request_id,
        model=msg.model,
        prompt_token_ids=list(msg.prompt_token_ids),
        max_tokens=MaxTokens(msg.max_tokens, is_cap=msg.max_tokens_is_cap),
        sampling=sampling_from_proto(msg.sampling),
        stop_token_ids=list(msg.stop_token_ids),
        ignore_eos=msg.ignore_eos,
        priority=msg.priority,
        tenant=msg.tenant,
        trace_context=dict(msg.trace.carrier),
        resumed_output_tokens=msg.resumed_output_tokens,
        migrations=msg.migrations,
    )


def _error(request_id: str, error: LayerserveError) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        finish_reason=common_pb2.FINISH_REASON_ERROR,
        error=common_pb2.Status(
            code=code_number(error), message=error.message, param=error.param or ""
        ),
    )
