"""The scheduler's side of the wire to one worker: its health, what it says about itself
(Describe), and the Execute stream that carries one batched message per engine step each way.
A transport only: it converts steps and results to and from protobuf; the engine (engine.py)
decides what to send."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from layerserve.common.v1 import common_pb2
from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.errors import error_from_code
from services.common.grpc_util import new_channel
from services.common.health import service_name
from services.common.peer_health import PeerHealth
from services.common.sampling_proto import sampling_to_proto
from services.scheduler.kv_cache_manager import group_windows
from services.scheduler.step import Sample, ScheduledStep, StepContexts, StepResult
from services.scheduler.worker_info import WorkerInfo


def step_to_proto(
    step: ScheduledStep, step_id: int, contexts: StepContexts | None = None
) -> worker_pb2.StepRequest:
    """contexts: those of the step's spans, which the worker continues (None: not traced here;
    new sequences carry their caller's)."""
    msg = worker_pb2.StepRequest(step_id=step_id, finished_ids=step.finished_ids)
    for new in step.new:
        request = new.request
        msg.new_sequences.append(
            worker_pb2.NewSequence(
                request_id=request.request_id,
                token_ids=request.all_token_ids,
                num_prompt_tokens=request.num_prompt_tokens,
                num_computed_tokens=new.num_cached,
                num_new_tokens=new.num_new,
                sampling=sampling_to_proto(request.sampling),
                trace=common_pb2.TraceContext(carrier=request.trace_context),
                block_tables=_block_tables(request.block_tables),
            )
        )
    for running in step.running:
        msg.running.append(
            worker_pb2.RunningSequence(
                request_id=running.request.request_id,
                num_new_tokens=running.num_new,
                new_block_tables=_block_tables(running.new_blocks),
                draft_token_ids=running.draft_token_ids,
            )
        )
    if contexts is not None:
        _add_contexts(msg, contexts)
    return msg


def _add_contexts(msg: worker_pb2.StepRequest, contexts: StepContexts) -> None:
    """The step's context, and each sequence's prefill span's (others get none)."""
    msg.trace.carrier.update(contexts.step)
    for seq in msg.new_sequences:
        seq.trace.carrier.clear()
        seq.trace.carrier.update(contexts.prefills.get(seq.request_id, {}))
    for seq in msg.running:
        carrier = contexts.prefills.get(seq.request_id)
        if carrier is not None:
            seq.trace.carrier.update(carrier)


def _block_tables(tables: list[list[int]]) -> list[worker_pb2.BlockTable]:
    """One table per KV cache group, on the wire."""
    return [worker_pb2.BlockTable(block_ids=table) for table in tables]


def result_from_proto(msg: worker_pb2.StepResult) -> StepResult:
    samples = [
        Sample(
            s.request_id,
            s.token_id,
            s.logprob if s.HasField("logprob") else None,
            error_from_code(s.error.code, s.error.message) if s.HasField("error") else None,
            list(s.prompt_logprobs),
            list(s.embedding) if s.embedding else None,
        )
        for s in msg.sampled
    ]
    error = msg.error.message if msg.HasField("error") else None
    return StepResult(samples, msg.forward_ns, error)


def info_from_proto(msg: worker_pb2.WorkerInfo) -> WorkerInfo:
    return WorkerInfo(
        model=msg.model,
        block_size=msg.block_size,
        num_blocks=msg.num_blocks,
        max_model_len=msg.max_model_len,
        vocab_size=msg.vocab_size,
        eos_token_ids=frozenset(msg.eos_token_ids),
        model_fingerprint=msg.model_fingerprint,
        model_path=msg.model_path,
        device=msg.device,
        windows=group_windows(g.sliding_window for g in msg.kv_cache_groups),
    )


def failure_reason(error: BaseException) -> str | None:
    """Why the worker failed us, when `error` is the wire's doing (None: a bug here)."""
    if isinstance(error, grpc.aio.AioRpcError):
        return error.details() or error.code().name
    return None


def _closed() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, None, None, "the worker closed the step stream"
    )


class StepStream:
    """One Execute call: steps out, their results back in the same order. A step may be sent
    before the last one's result is read (asynchronous scheduling): the worker queues it."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self._call = call

    def check_open(self) -> None:
        """Raises (UNAVAILABLE) once the worker has ended the call."""
        if self._call.done():
            raise _closed()

    async def send(self, step: ScheduledStep, step_id: int, contexts: StepContexts | None) -> None:
        """Raises grpc.aio.AioRpcError when the stream fails or has ended."""
        await self._call.write(step_to_proto(step, step_id, contexts))

    async def receive(self) -> StepResult:
        """The result of the oldest step sent and not yet answered. Raises grpc.aio.AioRpcError
        when the stream fails or ends."""
        result = await self._call.read()
        if result is grpc.aio.EOF:
            raise _closed()
        return result_from_proto(result)

    def close(self) -> None:
        self._call.cancel()


class WorkerLink:
    """The channel to the worker at `address`, and its health as the worker reports it."""

    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = new_channel(address)
        self._stub = worker_pb2_grpc.WorkerStub(self._channel)
        # The worker's own word: warmed up, no step hung, not draining.
        self.health = PeerHealth(
            self._channel, service_name(worker_pb2, "Worker"), f"worker {address}"
        )

    async def describe(self) -> WorkerInfo:
        """Waits for the worker to answer."""
        msg = await self._stub.Describe(worker_pb2.DescribeRequest(), wait_for_ready=True)
        return info_from_proto(msg)

    def open(self, on_end: Callable[[], None]) -> StepStream:
        """A new Execute stream; on_end is called when it ends, from either side."""
        call = self._stub.Execute()
        call.add_done_callback(lambda _: on_end())
        return StepStream(call)

    async def close(self) -> None:
        await self.health.stop()
        await self._channel.close()
