"""The scheduler's side of one worker: its Scheduler (blocks, queues) and the step loop that
drives the worker over one Execute stream, one batched message per step each way."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import grpc

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common import tracing
from services.common.grpc_util import new_channel
from services.common.health import service_name
from services.common.peer_health import PeerHealth
from services.scheduler.block_pool import BlockPool
from services.scheduler.cache_events import CacheEventListener
from services.scheduler.kv_cache_manager import KVCacheManager, group_windows
from services.scheduler.request import FinishReason, Request
from services.scheduler.scheduler import Sample, ScheduledStep, Scheduler, SchedulerLimits
from services.scheduler.scheduler_metrics import observe_step
from services.scheduler.step_trace import StepTrace

log = logging.getLogger(__name__)

Emit = Callable[[list[scheduler_pb2.RequestOutput]], None]

_FINISH = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: common_pb2.FINISH_REASON_ABORT,
    FinishReason.ERROR: common_pb2.FINISH_REASON_ERROR,
}
RECONNECT_SECONDS = 1.0


def step_to_proto(
    step: ScheduledStep, step_id: int, trace: StepTrace | None = None
) -> worker_pb2.StepRequest:
    """trace: the step's spans, whose contexts the worker continues (None: not traced)."""
    msg = worker_pb2.StepRequest(step_id=step_id, finished_ids=step.finished_ids)
    for request, num_new in step.new:
        msg.new_sequences.append(
            worker_pb2.NewSequence(
                request_id=request.request_id,
                token_ids=request.all_token_ids,
                num_prompt_tokens=request.num_prompt_tokens,
                num_computed_tokens=request.num_computed_tokens - num_new,
                num_new_tokens=num_new,
                sampling=request.sampling.to_proto(),
                trace=common_pb2.TraceContext(carrier=request.trace_context),
                block_tables=_block_tables(request.block_tables),
            )
        )
    for request, num_new, new_blocks in step.running:
        msg.running.append(
            worker_pb2.RunningSequence(
                request_id=request.request_id,
                num_new_tokens=num_new,
                new_block_tables=_block_tables(new_blocks),
            )
        )
    if trace is not None:
        trace.annotate(msg)
    return msg


def _block_tables(tables: list[list[int]]) -> list[worker_pb2.BlockTable]:
    """One table per KV cache group, on the wire."""
    return [worker_pb2.BlockTable(block_ids=table) for table in tables]


def output_for(request: Request, sample: Sample) -> scheduler_pb2.RequestOutput:
    out = scheduler_pb2.RequestOutput(
        request_id=request.request_id,
        token_ids=[sample.token_id],
        prompt_tokens=request.num_prompt_tokens,
        cached_tokens=request.num_cached_tokens,
    )
    if sample.logprob is not None:
        out.logprobs.append(sample.logprob)
    if request.finish_reason is not None:
        out.finish_reason = _FINISH[request.finish_reason]
    return out


def error_output(request_id: str, code: grpc.StatusCode, message: str):
    return scheduler_pb2.RequestOutput(
        request_id=request_id,
        finish_reason=common_pb2.FINISH_REASON_ERROR,
        error=common_pb2.Status(code=code.value[0], message=message),
    )


class WorkerLink:
    def __init__(
        self,
        address: str,
        limits: SchedulerLimits,
        emit: Emit,
        cache_events: CacheEventListener | None = None,
    ) -> None:
        self.address = address
        self.limits = limits
        self._emit = emit
        # Told about every block this worker's prefix cache stores or evicts (a prefix index).
        self.cache_events = cache_events
        self._channel = new_channel(address)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        # The worker's own word: warmed up, no step hung, not draining.
        self.health = PeerHealth(
            self._channel, service_name(worker_pb2, "Worker"), f"worker {address}"
        )
        self.info: worker_pb2.WorkerInfo | None = None
        self.scheduler: Scheduler | None = None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._step_id = 0

    @property
    def ready(self) -> bool:
        """Live: connected, and the worker reports SERVING. Only a ready link gets new
        requests; one that stops being ready still runs those it has."""
        return self.scheduler is not None and self.health.serving

    def why_not_ready(self) -> str:
        if self.scheduler is None:
            return f"worker {self.address} is not connected"
        return self.health.reason

    @property
    def load(self) -> int:
        s = self.scheduler
        return len(s.requests) if s is not None else 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run_forever())
        self.health.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.health.stop()
        await self._channel.close()

    def submit(self, request: Request) -> None:
        """Raises ResourceExhausted when the worker's queue is full."""
        assert self.scheduler is not None, "submit to a link that is not ready"
        self.scheduler.add(request)
        if request.trace is not None:
            request.trace.queued(request, self.address)
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        request = self.scheduler.abort(request_id) if self.scheduler is not None else None
        if request is not None:
            _end_trace(request)
            self._wakeup.set()

    async def _run_forever(self) -> None:
        while True:
            try:
                await self._connect()
                await self._step_loop()
            except grpc.aio.AioRpcError as err:
                log.warning("worker %s: %s", self.address, err.details() or err.code().name)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug must not strand the link: fail its requests, reconnect
                log.exception("worker %s: step loop failed", self.address)
            self._fail_all(f"worker {self.address} became unavailable")
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _connect(self) -> None:
        self.info = await self._stub.Describe(worker_pb2.DescribeRequest(), wait_for_ready=True)
        pool = BlockPool(self.info.num_blocks, listener=self.cache_events)
        windows = group_windows(g.sliding_window for g in self.info.kv_cache_groups)
        kv = KVCacheManager(pool, self.info.block_size, self.info.model_fingerprint, windows)
        eos = frozenset(self.info.eos_token_ids)
        self.scheduler = Scheduler(self.limits, kv, self.info.max_model_len, eos)
        log.info(
            "worker %s ready: model %s, %d blocks of %d tokens, KV cache group windows %s",
            self.address,
            self.info.model,
            self.info.num_blocks,
            self.info.block_size,
            windows,
        )

    async def _step_loop(self) -> None:
        assert self.scheduler is not None
        scheduler = self.scheduler
        call = self._stub.Execute()
        # A worker that dies while the link is idle ends the call: wake up to notice, so the
        # link leaves rotation (ready is False) before a request is routed to a dead worker.
        call.add_done_callback(lambda _: self._wakeup.set())
        try:
            while True:
                if call.done():
                    raise grpc.aio.AioRpcError(
                        grpc.StatusCode.UNAVAILABLE, None, None, "the worker closed the step stream"
                    )
                self._expire()
                if not scheduler.has_work():
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                step = scheduler.schedule()
                if step.is_empty:
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                self._step_id += 1
                observe_step(self.info.model if self.info else "", step, scheduler.clock())
                await self._execute(call, step)
        finally:
            call.cancel()

    async def _execute(self, call: grpc.aio.StreamStreamCall, step: ScheduledStep) -> None:
        """Sends the step, waits for the worker's result and applies it."""
        trace = StepTrace.begin(step, self._step_id, self.address)  # None: not traced
        try:
            await call.write(step_to_proto(step, self._step_id, trace))
            result = await call.read()
            if result is grpc.aio.EOF:
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.UNAVAILABLE, None, None, "the worker closed the step stream"
                )
        except BaseException as exc:
            if trace is not None:
                trace.end(None, type(exc).__name__)
            raise
        if trace is not None:
            trace.end(result)  # first: a request the step finishes ends after its prefill span
        self._apply(result)

    def _apply(self, result: worker_pb2.StepResult) -> None:
        assert self.scheduler is not None
        if result.HasField("error"):
            raise grpc.aio.AioRpcError(
                grpc.StatusCode.INTERNAL,
                None,
                None,
                f"worker rejected a step: {result.error.message}",
            )
        samples = [
            Sample(s.request_id, s.token_id, s.logprob if s.HasField("logprob") else None)
            for s in result.sampled
        ]
        updated = self.scheduler.update(samples)
        if tracing.enabled():
            for request, _ in updated:
                _trace_token(request)
        if updated:
            self._emit([output_for(request, sample) for request, sample in updated])

    def _expire(self) -> None:
        assert self.scheduler is not None
        expired = self.scheduler.expire()
        if expired:
            code = grpc.StatusCode.DEADLINE_EXCEEDED
            message = (
                f"the request waited {self.limits.max_queue_wait_s:g}s in the queue without "
                "starting: the server is overloaded; retry later"
            )
            self._emit([error_output(r.request_id, code, message) for r in expired])
            for request in expired:
                _end_trace(request, code.name)

    def _fail_all(self, message: str) -> None:
        if self.scheduler is None:
            return
        failed = self.scheduler.fail_all()
        self.scheduler = None
        if failed:
            code = grpc.StatusCode.UNAVAILABLE
            self._emit([error_output(r.request_id, code, message) for r in failed])
            for request in failed:
                _end_trace(request, code.name)


def _trace_token(request: Request) -> None:
    if request.trace is not None:
        request.trace.sampled()
        if request.finish_reason is not None:
            _end_trace(request)


def _end_trace(request: Request, error: str | None = None) -> None:
    if request.trace is not None:
        request.trace.finish(request, error)
        request.trace = None
