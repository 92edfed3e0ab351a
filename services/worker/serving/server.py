"""worker.v1.Worker over gRPC: protobuf in, ModelRunner.execute in a dedicated thread (the
event loop never waits on the model), protobuf out. Also what its health reports: ready once
the warm-up step has run, and not while a step overruns its bound (step_watch.py).

A step that arrives while another runs (the scheduler schedules asynchronously: engine.py) is
queued on the model thread at once, so the thread starts it the moment the last one ends; its
running sequences' next input is the token the thread has just sampled for them."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import grpc

from layerserve.common.v1 import common_pb2
from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.errors import code_number
from services.common.sampling_proto import sampling_from_proto
from services.worker.config import DEFAULT_STEP_TIMEOUT_S
from services.worker.engine.plan import NewSequence, RunningSequence, Sampled, StepPlan
from services.worker.engine.warm_up import warm_up
from services.worker.serving.step_metrics import MODEL_FORWARD_TIME
from services.worker.serving.step_trace import StepTrace
from services.worker.serving.step_watch import StepWatch

log = logging.getLogger(__name__)


class Runner(Protocol):
    block_size: int
    num_blocks: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    fingerprint: str
    device: str
    dtype: str
    kernels: str
    kv_cache_groups: Sequence  # kv_cache.KVCacheGroup; empty = one group of every layer

    def execute(self, plan: StepPlan) -> list[Sampled]: ...


def plan_from_proto(msg: worker_pb2.StepRequest) -> StepPlan:
    return StepPlan(
        new=[
            NewSequence(
                request_id=s.request_id,
                token_ids=list(s.token_ids),
                num_prompt_tokens=s.num_prompt_tokens,
                num_computed_tokens=s.num_computed_tokens,
                num_new_tokens=s.num_new_tokens,
                block_tables=[list(t.block_ids) for t in s.block_tables],
                sampling=sampling_from_proto(s.sampling),
            )
            for s in msg.new_sequences
        ],
        running=[
            RunningSequence(
                s.request_id,
                s.num_new_tokens,
                [list(t.block_ids) for t in s.new_block_tables],
                list(s.draft_token_ids),
            )
            for s in msg.running
        ],
        finished_ids=list(msg.finished_ids),
    )


def _groups_to_proto(runner: Runner) -> list[worker_pb2.KVCacheGroup]:
    """A runner with one KV cache group (every layer, no window) reports none: the default."""
    groups = runner.kv_cache_groups
    if len(groups) == 1 and groups[0].window is None:
        return []
    return [
        worker_pb2.KVCacheGroup(num_layers=len(g.layers), sliding_window=g.window or 0)
        for g in groups
    ]


def sampled_to_proto(sampled: Sampled) -> worker_pb2.SampledToken:
    msg = worker_pb2.SampledToken(request_id=sampled.request_id, token_id=sampled.token_id)
    if sampled.error is not None:
        msg.error.code = code_number(sampled.error)
        msg.error.message = sampled.error.message
        return msg
    for token_id, logprob, top in sampled.prompt_logprobs:
        scored = msg.prompt_logprobs.add(token_id=token_id, logprob=logprob)
        for alternative, value in top:
            scored.top.add(token_id=alternative, logprob=value)
    if sampled.embedding is not None:
        msg.embedding.extend(sampled.embedding)
    if sampled.logprob is not None:
        msg.logprob.token_id = sampled.token_id
        msg.logprob.logprob = sampled.logprob
        for token_id, logprob in sampled.top_logprobs:
            msg.logprob.top.add(token_id=token_id, logprob=logprob)
    return msg


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(
        self,
        runner: Runner,
        model_name: str,
        model_path: str = "",
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        self._runner = runner
        self._model_name = model_name
        self._model_path = model_path  # absolute; "" = the embedded default model
        # One thread: steps run strictly in order, and the model's own intra-op threads do
        # the parallel work.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-step")
        self._driven = False
        self._held: set[str] = set()  # requests the driving scheduler has us hold
        self._steps = StepWatch(step_timeout_s)
        self._warmed_up = False

    @property
    def num_held(self) -> int:
        """Requests in flight here: a drain waits for the scheduler to finish them."""
        return len(self._held)

    def readiness(self) -> str | None:
        """Why the worker cannot take requests now, or None."""
        if not self._warmed_up:
            return "the warm-up step has not run yet"
        return self._steps.problem()

    def start_warm_up(self) -> asyncio.Future[None]:
        """Queues the warm-up step on the model thread. Call it before the server starts: the
        scheduler's first step then runs after it."""
        future = self._in_step_thread(warm_up, self._runner)
        future.add_done_callback(self._on_warmed_up)
        return future

    def _on_warmed_up(self, future: asyncio.Future[None]) -> None:
        if not future.cancelled() and future.exception() is None:
            self._warmed_up = True

    def _in_step_thread(self, fn: Callable, *args) -> asyncio.Future:
        """Queues fn on the model thread (at once: callers rely on the order), timed by the
        step watch."""
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(self._executor, self._steps.run, fn, *args)

    async def Describe(self, request, context) -> worker_pb2.WorkerInfo:
        r = self._runner
        return worker_pb2.WorkerInfo(
            model=self._model_name,
            block_size=r.block_size,
            num_blocks=r.num_blocks,
            max_model_len=r.max_model_len,
            vocab_size=r.vocab_size,
            eos_token_ids=list(r.eos_token_ids),
            device=r.device,
            dtype=r.dtype,
            kernels=r.kernels,
            model_fingerprint=r.fingerprint,
            model_path=self._model_path,
            kv_cache_groups=_groups_to_proto(r),
        )

    async def Execute(
        self, request_iterator: AsyncIterator[worker_pb2.StepRequest], context
    ) -> AsyncIterator[worker_pb2.StepResult]:
        if self._driven:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "this worker is already driven by a scheduler"
            )
        self._driven = True
        held: set[str] = set()  # its own: a stream that follows must not share it
        self._held = held
        # Steps queued on the model thread, answered in order. A reader queues each step as it
        # arrives (None: the scheduler closed its side).
        queued: asyncio.Queue[asyncio.Future[worker_pb2.StepResult] | None] = asyncio.Queue()
        reader = asyncio.ensure_future(self._queue_steps(request_iterator, held, queued))
        try:
            while (step := await queued.get()) is not None:
                yield await step
            await reader  # its error, if it failed
        finally:
            self._driven = False
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            if held:  # the scheduler went away: drop what it had us hold (after its steps)
                dropped = len(held)
                await self._in_step_thread(self._runner.execute, StepPlan(finished_ids=list(held)))
                held.clear()
                log.info("scheduler stream closed; dropped %d requests", dropped)

    async def _queue_steps(
        self,
        request_iterator: AsyncIterator[worker_pb2.StepRequest],
        held: set[str],
        queued: asyncio.Queue[asyncio.Future[worker_pb2.StepResult] | None],
    ) -> None:
        """Queues every step of the stream on the model thread as it arrives. `held` counts a
        step's new sequences from when it is queued: a step rejected later held none of them,
        and dropping an id the runner does not hold is harmless."""
        try:
            async for msg in request_iterator:
                plan = plan_from_proto(msg)
                held.difference_update(plan.finished_ids)
                held.update(s.request_id for s in plan.new)
                queued.put_nowait(self._traced_step(msg, plan))
        finally:
            queued.put_nowait(None)

    def _traced_step(
        self, msg: worker_pb2.StepRequest, plan: StepPlan
    ) -> asyncio.Future[worker_pb2.StepResult]:
        """Queues the step on the model thread now; the future is its result."""
        return self._in_step_thread(self._run_traced_step, msg, plan)

    def _run_traced_step(
        self, msg: worker_pb2.StepRequest, plan: StepPlan
    ) -> worker_pb2.StepResult:
        """On the model thread: the step inside its spans when traced (step_trace.py), begun
        when the thread takes it up, not while it waits behind the step before."""
        trace = StepTrace.begin(msg)  # None: not traced
        try:
            result = self._run_step(plan)
        except BaseException as exc:
            if trace is not None:
                trace.end(None, exc)
            raise
        result.step_id = msg.step_id
        if trace is not None:
            trace.end(result)
        return result

    def _run_step(self, plan: StepPlan) -> worker_pb2.StepResult:
        started = time.perf_counter_ns()
        try:
            sampled = self._runner.execute(plan)
        except ValueError as err:
            log.error("rejected an inconsistent step: %s", err)
            return worker_pb2.StepResult(
                error=common_pb2.Status(
                    code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message=str(err)
                ),
            )
        forward_ns = time.perf_counter_ns() - started
        MODEL_FORWARD_TIME.labels(self._model_name).observe(forward_ns / 1e9)
        return worker_pb2.StepResult(
            sampled=[sampled_to_proto(s) for s in sampled], forward_ns=forward_ns
        )
