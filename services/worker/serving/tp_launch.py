"""Starting a tensor-parallel worker's ranks, and making them fail together.

The worker process is rank 0: it spawns ranks 1..N-1 (torch.multiprocessing, spawn start),
which join the process group over TCP on loopback as torchrun's ranks would, build their
shard and then run rank 0's plans (TensorParallelRunner.follow) until it stops them.

Ranks live and die together: a rank that exits while the group runs ends the worker, with a
log line naming it (its in-flight collectives could otherwise hang forever, and a partial
model cannot serve); the scheduler then sees the worker UNAVAILABLE. A rank whose parent is
gone exits too (its next collective fails; a watch covers a rank stuck in a kernel)."""

from __future__ import annotations

import atexit
import dataclasses
import logging
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing.process import BaseProcess

import torch.distributed as dist
import torch.multiprocessing as mp

from services.common.logs import setup_logging
from services.worker.engine.tp_runner import TensorParallelRunner
from services.worker.serving.tp_rank import RankSpec, build_rank_runner
from services.worker.thread_choice import rank_threads

log = logging.getLogger(__name__)

# The exit status of a worker whose rank died (EX_SOFTWARE).
RANK_DIED_EXIT_CODE = 70
_POLL_S = 0.2
_STOP_GRACE_S = 10.0


def start_tensor_parallel(spec: RankSpec) -> TensorParallelRunner:
    """Spawns ranks 1..N-1 and builds rank 0 here; returns rank 0's runner. Its close() stops
    the other ranks. ValueError (before any process starts) when the split cannot work."""
    spec.check()
    threads = rank_threads(spec.threads, spec.world_size)
    how = "--threads" if spec.threads else "auto: the usable cores shared by the ranks"
    log.info("%d torch threads in each of %d ranks (%s)", threads, spec.world_size, how)
    spec = dataclasses.replace(spec, master_port=_free_port(spec.master_addr), threads=threads)
    context = mp.get_context("spawn")
    ranks = [
        context.Process(
            target=run_rank,
            args=(spec, rank, os.getpid()),
            name=f"tp-rank-{rank}",
            daemon=True,  # if this process exits without close(), the ranks go with it
        )
        for rank in range(1, spec.world_size)
    ]
    for rank, process in enumerate(ranks, start=1):
        process.start()
        log.info(
            "tensor-parallel rank %d of %d started (pid %d)", rank, spec.world_size, process.pid
        )
    watch = RankWatch(ranks)
    watch.start()
    # At an exit without close() (a failed start), multiprocessing's own exit handler, which
    # runs after this one, terminates the ranks: that is no failure to report.
    atexit.register(watch.disarm)
    try:
        return build_rank_runner(spec, rank=0, on_close=lambda: _stop(watch))
    except BaseException:
        watch.disarm()
        for process in ranks:
            process.kill()
        _stop(watch)
        raise


def _stop(watch: RankWatch) -> None:
    watch.stop()
    atexit.unregister(watch.disarm)
    if dist.is_initialized():
        dist.destroy_process_group()


class RankWatch:
    """Rank 0's watch over the processes of ranks 1..N-1."""

    def __init__(self, processes: list[BaseProcess]) -> None:
        self._processes = processes
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tp-rank-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def disarm(self) -> None:
        """From now on a rank's exit is expected, not a failure."""
        self._stopping.set()

    def stop(self) -> None:
        """After the ranks were told to stop: waits for them (kills what is left after a grace
        period), without taking their exits for failures."""
        self.disarm()
        deadline = time.monotonic() + _STOP_GRACE_S
        for process in self._processes:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("tensor-parallel %s did not stop; killing it", process.name)
                process.kill()
                process.join()
        self._thread.join()

    def _watch(self) -> None:
        sentinels = {p.sentinel: (rank, p) for rank, p in enumerate(self._processes, start=1)}
        while not self._stopping.is_set():
            ended = multiprocessing.connection.wait(list(sentinels), timeout=_POLL_S)
            if ended and not self._stopping.is_set():
                rank, process = sentinels[ended[0]]
                self._fail(rank, process)

    def _fail(self, rank: int, process: BaseProcess) -> None:
        """Ends this process (and the other ranks): steps in flight can never complete."""
        process.join()
        log.critical(
            "tensor-parallel rank %d (pid %d) died (%s); the ranks fail together: "
            "this worker exits",
            rank,
            process.pid,
            _describe_exit(process.exitcode),
        )
        for other in self._processes:
            if other.is_alive():
                other.kill()
        logging.shutdown()  # flush the line above: os._exit skips it
        os._exit(RANK_DIED_EXIT_CODE)


def run_rank(spec: RankSpec, rank: int, parent_pid: int) -> None:
    """The entry point of ranks 1..N-1 (a spawned process)."""
    # Ctrl-C reaches the whole process group; rank 0 alone decides when the ranks stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    setup_logging(f"worker-rank{rank}")
    threading.Thread(target=_exit_with_parent, args=(parent_pid, rank), daemon=True).start()
    runner = build_rank_runner(spec, rank)
    log.info("tensor-parallel rank %d ready on %s", rank, runner.device)
    try:
        runner.follow()
    except Exception:
        log.exception("tensor-parallel rank %d lost rank 0 or failed a step; exiting", rank)
        sys.exit(1)
    dist.destroy_process_group()


def _exit_with_parent(parent_pid: int, rank: int) -> None:
    """Ends this rank when rank 0 is gone, even while it waits inside a collective."""
    while os.getppid() == parent_pid:
        time.sleep(_POLL_S)
    log.error("tensor-parallel rank %d: rank 0 (pid %d) is gone; exiting", rank, parent_pid)
    logging.shutdown()
    os._exit(1)


def _describe_exit(code: int | None) -> str:
    if code is not None and code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
