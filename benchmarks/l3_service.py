"""L3: the whole stack (gateway, tokenizer, scheduler, worker: four processes) through the
gateway's streaming /v1/completions, at each max concurrency of a sweep (all requests
queued at t=0) and at each Poisson arrival rate (no concurrency limit).

The stack runs with prefix caching on, as it ships. So that no run hits blocks cached by an
earlier one, every run sends a fresh variant of the workload: the same lengths, new token ids
(for shared-prefix, a new shared prefix). Shared-prefix also runs on a second stack with
caching off. Every request must return exactly the tokens it asked for (EOS is ignored). Each
workload runs once per sampling mode (benchmarks/sampling.py), each request with its own seed.
The worker computes as L2's first precision pairing says (benchmarks/precision.py; float32
without one). `single-stream` runs at concurrency 1 only: it is one request at a time."""

from __future__ import annotations

import asyncio
import socket
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.arrivals import poisson_arrivals
from benchmarks.metrics import Slo
from benchmarks.offline import BLOCK_SIZE, MODEL
from benchmarks.precision import Precision
from benchmarks.progress import Progress
from benchmarks.sampling import GREEDY, Sampling
from benchmarks.scales import Scale
from benchmarks.service import run_through_gateway
from benchmarks.workload import build_workload
from services.stack import Stack, StackConfig


@dataclass(frozen=True, slots=True)
class L3Plan:
    scale: Scale
    seed: int
    workloads: tuple[str, ...]
    concurrency: tuple[int, ...]
    rates: tuple[float, ...]
    slo: Slo
    repeats: int
    threads: int = 0  # the worker's --threads (0: torch's default)
    samplings: tuple[Sampling, ...] = (GREEDY,)
    precision: Precision | None = None  # the worker's dtype and quantization (None: float32)

    def runs(self) -> int:
        per_setting = sum(
            (1 + (w == "shared-prefix")) * len(self.points(w)) for w in self.workloads
        )
        return per_setting * len(self.samplings) * self.repeats

    def points(self, workload: str) -> list[tuple[str, int | None, float | None]]:
        """(label, max concurrency, Poisson rate) of each sweep point of the workload."""
        if workload == "single-stream":
            return [("concurrency 1", 1, None)]
        return [(f"concurrency {c}", c, None) for c in self.concurrency] + [
            (f"poisson {r:g}/s", None, r) for r in self.rates
        ]


def run_l3(plan: L3Plan, progress: Progress) -> dict:
    """{"rows": [one per workload, cache setting and sweep point]}."""
    rows = _on_stack(plan, plan.workloads, caching=True, progress=progress)
    if "shared-prefix" in plan.workloads:
        rows += _on_stack(plan, ("shared-prefix",), caching=False, progress=progress)
    return {"rows": rows, "redis": "off", "stream": True}


def _on_stack(plan: L3Plan, workloads: tuple[str, ...], caching: bool, progress) -> list[dict]:
    progress.stage(f"L3 starting the stack (prefix cache {'on' if caching else 'off'})")
    rows = []
    with tempfile.TemporaryDirectory() as logs:
        stack = Stack(_stack_config(plan, caching, Path(logs)))
        stack.start()
        try:
            for name in workloads:
                for sampling in plan.samplings:
                    rows += _sweep(plan, name, sampling, stack.http_url, caching, progress)
        finally:
            stack.stop()
    return rows


def _sweep(
    plan: L3Plan, name: str, sampling: Sampling, url: str, caching: bool, progress: Progress
) -> list[dict]:
    variant = iter(range(1, 1 << 30))
    warm = build_workload(name, plan.scale, plan.seed, variant=0)[:2]
    asyncio.run(run_through_gateway(url, MODEL, warm, sampling=sampling))  # warm-up, excluded
    rows = []
    for label, concurrency, rate in plan.points(name):
        progress.stage(f"L3 {name} ({sampling.name}): {label}" + ("" if caching else ", cache off"))
        runs = []
        for _ in range(plan.repeats):
            items = build_workload(name, plan.scale, plan.seed, variant=next(variant))
            send_at = None if rate is None else poisson_arrivals(rate, len(items), plan.seed)
            sent = run_through_gateway(
                url, MODEL, items, concurrency, send_at, plan.slo, sampling, plan.seed
            )
            runs.append(asyncio.run(sent))
            progress.advance()
        median = sorted(runs, key=lambda r: r["wall_s"])[len(runs) // 2]
        rows.append(
            {
                "workload": name,
                "sampling": sampling.name,
                "prefix_cache": caching,
                "setting": plan.precision.layerserve() if plan.precision else "float32",
                "mode": "concurrency" if rate is None else "poisson",
                "concurrency": concurrency,
                "rate": rate,
                "runs_wall_s": [r["wall_s"] for r in runs],
                "median_wall_s": statistics.median(r["wall_s"] for r in runs),
                **median,
            }
        )
    return rows


def _stack_config(plan: L3Plan, caching: bool, log_dir: Path) -> StackConfig:
    http, grpc_port, tok, sched, worker = _free_ports(5)
    s = plan.scale
    return StackConfig(
        http_port=http,
        grpc_port=grpc_port,
        tokenizer_port=tok,
        scheduler_port=sched,
        worker_ports=(worker,),
        model_name=MODEL,
        scheduler_args=[
            "--max-num-batched-tokens",
            str(s.max_num_batched_tokens),
            "--max-num-seqs",
            str(s.max_num_seqs),
            "--prefix-caching" if caching else "--no-prefix-caching",
        ],
        worker_args=[
            *("--num-blocks", str(_num_blocks(plan)), "--threads", str(plan.threads)),
            *(plan.precision.worker_args() if plan.precision else ("--dtype", "float32")),
        ],
        log_dir=log_dir,
        redis="off",  # one replica: nothing to route; keeps a process off the shared cores
    )


def _num_blocks(plan: L3Plan) -> int:
    """Enough KV for `max_num_seqs` of the longest request of any workload, plus slack."""
    longest = max(
        len(i.prompt_ids) + i.output_len
        for name in plan.workloads
        for i in build_workload(name, plan.scale, plan.seed)
    )
    return plan.scale.max_num_seqs * -(-longest // BLOCK_SIZE) + 16


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
