"""The engine of one worker: its Scheduler, and the loop that drives the worker step by step.

    async def step(self) -> bool:
        ...
        self._expire()  # requests that waited too long to start end
        step = self.scheduler.schedule() if self.scheduler.has_work() else None
        sent = step is not None and not step.is_empty
        if sent:
            await self._send(step)  # the worker queues it behind the step it computes
        if not self._in_flight:
            return False
        if len(self._in_flight) >= self.max_steps_in_flight or not sent:
            self._update(await self._receive())  # tokens appended, finishes, outputs emitted
        return True

(`...`: its docstring and an assert; tests/unit/test_docs_snippets.py holds these lines to the
code below.)

Asynchronous scheduling (max_steps_in_flight 2; --async-scheduling auto, the default, turns it
on for a worker that computes on a GPU): step n + 1 is scheduled and sent while the worker
computes step n, so the scheduler's host work (applying step n - 1's tokens, emitting outputs,
scheduling, protobuf, the hop) overlaps the worker's step instead of adding to it: steps per
second approach 1 / max(host, device) rather than 1 / (host + device). The
requests of step n + 1 that sample in step n get their token as a placeholder, which the worker
fills in from its own sampled token (result_applier.py). Synchronous (1): each step's result is
applied before the next is scheduled.

Speculative decoding (a proposer, spec_decode.py) runs synchronously whatever
async_scheduling says, as vLLM v1 first did: a request's proposals follow its last token, which
must be known when the step is scheduled. With speculate_when_synchronous (the scheduler's
--num-speculative-tokens auto) it is the other way round: the proposer is used only for a
worker the engine steps synchronously anyway (a CPU worker), and dropped where it schedules
ahead.

The worker is reached through a WorkerLink (worker_link.py, the transport). When it fails (or
goes silent past the keepalive timeout), the engine hands its requests to `on_lost`
(migration.py: they move to another replica, their output kept) and connects again, with a
fresh Scheduler: the worker's KV cache is gone with it. Tracing, metrics and the counters
(scheduler_stats.py) watch the Scheduler's events (scheduler_events.py), and tracing brackets
each step (step_trace.py); the engine only wires them up.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from services.common.errors import Unavailable
from services.scheduler.block_pool import BlockPool
from services.scheduler.cache_events import CacheEventListener
from services.scheduler.kv_cache_manager import KVCacheManager
from services.scheduler.output import Output
from services.scheduler.request import Request
from services.scheduler.request_trace import RequestTracer, RequestTraces
from services.scheduler.result_applier import RequestUpdate
from services.scheduler.scheduler import Scheduler, SchedulerLimits
from services.scheduler.scheduler_events import SchedulerObserver
from services.scheduler.scheduler_metrics import SchedulerMetrics
from services.scheduler.spec_decode import Proposer
from services.scheduler.step import ScheduledStep, StepRejected, StepResult
from services.scheduler.step_trace import UNTRACED, StepTrace, StepTracer
from services.scheduler.worker_info import WorkerInfo
from services.scheduler.worker_link import StepStream, WorkerLink, failure_reason
from services.scheduler.worker_load import WorkerLoad

log = logging.getLogger(__name__)

Emit = Callable[[list[Output]], None]
# Told the requests a failed worker ran (released by its Scheduler), and why it failed.
OnLost = Callable[["Engine", list[Request], str], None]
RECONNECT_SECONDS = 1.0


class Engine:
    def __init__(
        self,
        address: str,
        limits: SchedulerLimits,
        emit: Emit,
        cache_events: CacheEventListener | None = None,
        traces: RequestTraces | None = None,
        async_scheduling: bool | None = True,
        proposer: Proposer | None = None,
        adaptive_speculation: bool = True,
        on_lost: OnLost | None = None,
        speculate_when_synchronous: bool = False,
    ) -> None:
        """async_scheduling: send each step before the last one's result is back (see above);
        None: only to a worker that computes on a GPU (decided when it connects). proposer:
        speculative decoding's (None: off); with one, steps are synchronous, unless
        speculate_when_synchronous: then it is used only where they are (see above).
        adaptive_speculation: as the Scheduler's. on_lost: where a failed worker's requests go
        (None: they end with UNAVAILABLE)."""
        self.address = address
        self.limits = limits
        self._emit = emit  # where outputs go (the server's sessions)
        # Told about every block this worker's prefix cache stores or evicts (a prefix index).
        self.cache_events = cache_events
        self.traces = traces  # the process's request traces; None: not tracing
        self.on_lost = on_lost
        self.link = WorkerLink(address)
        self.info: WorkerInfo | None = None  # once connected
        self.scheduler: Scheduler | None = None  # while connected
        self._stream: StepStream | None = None  # while connected
        self._step_tracer = StepTracer(traces, address) if traces is not None else None
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._step_id = 0
        self.proposer = proposer
        self.adaptive_speculation = adaptive_speculation
        self.speculate_when_synchronous = speculate_when_synchronous
        self._async_scheduling = async_scheduling and (
            proposer is None or speculate_when_synchronous
        )
        self.max_steps_in_flight = 2 if self._async_scheduling else 1
        self._in_flight: deque[StepTrace] = deque()  # steps sent, oldest first

    # -- the loop ------------------------------------------------------------------------------

    async def step(self) -> bool:
        """One turn of the loop: schedule and send a step, and apply the oldest step's result
        once max_steps_in_flight are out (or nothing more can be sent). False when nothing is
        left to run or to wait for (the loop then waits for a submit)."""
        assert self.scheduler is not None
        self._expire()  # requests that waited too long to start end
        step = self.scheduler.schedule() if self.scheduler.has_work() else None
        sent = step is not None and not step.is_empty
        if sent:
            await self._send(step)  # the worker queues it behind the step it computes
        if not self._in_flight:
            return False
        if len(self._in_flight) >= self.max_steps_in_flight or not sent:
            self._update(await self._receive())  # tokens appended, finishes, outputs emitted
        return True

    async def _send(self, step: ScheduledStep) -> None:
        """Sends the step to the worker; its spans stay open until its result is back."""
        assert self._stream is not None
        self._step_id += 1
        trace = self._trace_step(step)
        self._in_flight.append(trace)
        await self._stream.send(step, self._step_id, trace.contexts)

    async def _receive(self) -> StepResult:
        """Waits for the result of the oldest step in flight."""
        assert self._stream is not None
        result = await self._stream.receive()
        trace = self._in_flight.popleft()
        trace.end(result)  # first: a request the step finishes ends after its prefill span
        if result.error is not None:
            raise StepRejected(f"worker rejected a step: {result.error}")
        return result

    def _update(self, result: StepResult) -> None:
        assert self.scheduler is not None
        updates = self.scheduler.update(result.samples)
        if updates:
            self._emit([_output(update) for update in updates])

    def _expire(self) -> None:
        assert self.scheduler is not None
        self._emit_errors(self.scheduler.expire())

    def _emit_errors(self, ended: list[Request]) -> None:
        errors = [(r.request_id, r.error) for r in ended if r.error is not None]
        if errors:
            self._emit([Output.failed(request_id, error) for request_id, error in errors])

    # -- requests in and out ---------------------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Raises ResourceExhausted when the worker's queue is full."""
        assert self.scheduler is not None, "submit to an engine that is not ready"
        self.scheduler.add(request)
        self._wakeup.set()

    def abort(self, request_id: str) -> None:
        if self.scheduler is not None and self.scheduler.abort(request_id) is not None:
            self._wakeup.set()

    def load(self) -> WorkerLoad | None:
        """How busy the worker is (None: not connected)."""
        return self.scheduler.load() if self.scheduler is not None else None

    # -- the worker's life -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Live: connected, and the worker reports SERVING. Only a ready engine gets new
        requests; one that stops being ready still runs those it has."""
        return self.scheduler is not None and self.link.health.serving

    def why_not_ready(self) -> str:
        if self.scheduler is None:
            return f"worker {self.address} is not connected"
        return self.link.health.reason

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run_forever())
        self.link.health.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.link.close()

    async def _run_forever(self) -> None:
        while True:
            cause = "the step loop failed"
            try:
                await self._connect()
                await self._run()
            except asyncio.CancelledError:
                raise
            except StepRejected as err:
                log.warning("worker %s: %s", self.address, err)
                cause = str(err)
            except Exception as err:  # a bug must not strand the engine: move its requests
                if (reason := failure_reason(err)) is not None:
                    log.warning("worker %s: %s", self.address, reason)
                    cause = reason
                else:
                    log.exception("worker %s: step loop failed", self.address)
            self._lose_all(cause)
            await asyncio.sleep(RECONNECT_SECONDS)

    async def _connect(self) -> None:
        info = self.info = await self.link.describe()
        ahead = self._async_scheduling
        if ahead is None:
            ahead = info.device.startswith("cuda") and (
                self.proposer is None or self.speculate_when_synchronous
            )
        self.max_steps_in_flight = 2 if ahead else 1
        proposer = None if ahead else self.proposer  # ahead only with none or when_synchronous
        pool = BlockPool(info.num_blocks, listener=self.cache_events)
        kv = KVCacheManager(pool, info.block_size, info.model_fingerprint, info.windows)
        self.scheduler = Scheduler(
            self.limits,
            kv,
            info.max_model_len,
            info.eos_token_ids,
            observers=self._observers(),
            proposer=proposer,
            adaptive_speculation=self.adaptive_speculation,
        )
        log.info(
            "worker %s ready: model %s, %d blocks of %d tokens, KV cache group windows %s, "
            "asynchronous scheduling %s, speculative decoding %s",
            self.address,
            info.model,
            info.num_blocks,
            info.block_size,
            info.windows,
            "on" if ahead else "off",
            "off" if proposer is None else f"on (up to {proposer.k} tokens)",
        )

    def _observers(self) -> list[SchedulerObserver]:
        model = self.info.model if self.info is not None else ""
        observers: list[SchedulerObserver] = [SchedulerMetrics(model)]
        if self.traces is not None:
            observers.append(RequestTracer(self.traces, self.address))
        return observers

    def _trace_step(self, step: ScheduledStep) -> StepTrace:
        if self._step_tracer is None:
            return UNTRACED
        return self._step_tracer.begin(step, self._step_id)

    async def _run(self) -> None:
        """Steps while there is work; waits for a submit (or the stream's end) otherwise."""
        # A worker that dies while the engine is idle ends the stream: wake up to notice, so
        # the engine leaves rotation (ready is False) before a request is routed to a dead one.
        stream = self._stream = self.link.open(on_end=self._wakeup.set)
        try:
            while True:
                stream.check_open()
                if not await self.step():
                    self._wakeup.clear()
                    await self._wakeup.wait()
        except BaseException as exc:
            while self._in_flight:  # steps that never came back
                self._in_flight.popleft().end(None, type(exc).__name__)
            raise
        finally:
            stream.close()
            self._stream = None

    def _lose_all(self, cause: str) -> None:
        """The worker failed: its requests go to on_lost, or end with UNAVAILABLE."""
        if self.scheduler is None:
            return
        if self.on_lost is None:
            error = Unavailable(f"worker {self.address} became unavailable")
            failed = self.scheduler.fail_all(error)
            self.scheduler = None
            self._emit_errors(failed)
            return
        released = self.scheduler.release_all()
        self.scheduler = None  # first: the engine is not ready, so no request moves back here
        if released:
            self.on_lost(self, released, cause)


def _output(update: RequestUpdate) -> Output:
    """A request's tokens of one step (several with speculative decoding) in one output."""
    if update.error is not None:
        return Output.failed(update.request.request_id, update.error)
    return Output.sampled(update.request, *update.samples)
