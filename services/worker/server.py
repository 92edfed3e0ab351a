"""worker.v1.Worker over gRPC: protobuf in, ModelRunner.execute in a dedicated thread (the
event loop never waits on the model), protobuf out."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

import grpc

from layerserve.common.v1 import common_pb2
from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.sampling import SamplingOptions
from services.worker.plan import NewSequence, RunningSequence, Sampled, StepPlan

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
                block_ids=list(s.block_ids),
                sampling=SamplingOptions.from_proto(s.sampling),
            )
            for s in msg.new_sequences
        ],
        running=[
            RunningSequence(s.request_id, s.num_new_tokens, list(s.new_block_ids))
            for s in msg.running
        ],
        finished_ids=list(msg.finished_ids),
    )


def sampled_to_proto(sampled: Sampled) -> worker_pb2.SampledToken:
    msg = worker_pb2.SampledToken(request_id=sampled.request_id, token_id=sampled.token_id)
    if sampled.logprob is not None:
        msg.logprob.token_id = sampled.token_id
        msg.logprob.logprob = sampled.logprob
        for token_id, logprob in sampled.top_logprobs:
            msg.logprob.top.add(token_id=token_id, logprob=logprob)
    return msg


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, runner: Runner, model_name: str, model_path: str = "") -> None:
        self._runner = runner
        self._model_name = model_name
        self._model_path = model_path  # absolute; "" = the embedded default model
        # One thread: steps run strictly in order, and the model's own intra-op threads do
        # the parallel work.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-step")
        self._driven = False

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
            model_fingerprint=r.fingerprint,
            model_path=self._model_path,
        )

    async def Execute(
        self, request_iterator: AsyncIterator[worker_pb2.StepRequest], context
    ) -> AsyncIterator[worker_pb2.StepResult]:
        if self._driven:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, "this worker is already driven by a scheduler"
            )
        self._driven = True
        known: set[str] = set()
        loop = asyncio.get_running_loop()
        try:
            async for msg in request_iterator:
                plan = plan_from_proto(msg)
                result = await loop.run_in_executor(self._executor, self._run_step, plan)
                result.step_id = msg.step_id
                known.difference_update(plan.finished_ids)
                if not result.HasField("error"):
                    known.update(s.request_id for s in plan.new)
                yield result
        finally:
            self._driven = False
            if known:  # the scheduler went away: drop what it had us hold
                drop = StepPlan(finished_ids=list(known))
                await loop.run_in_executor(self._executor, self._runner.execute, drop)
                log.info("scheduler stream closed; dropped %d requests", len(known))

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
        return worker_pb2.StepResult(
            sampled=[sampled_to_proto(s) for s in sampled],
            forward_ns=time.perf_counter_ns() - started,
        )
