"""The sides of one L2 job (a workload in one sampling mode), each a System: layerserve's
engine in this process at each precision pairing (benchmarks/precision.py), transformers and
llama.cpp each in a child process (benchmarks/baseline_process.py), whose crash becomes its
row's note. Every side gets the same prompts, output lengths, seeds and requests in flight."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.baseline_process import BaselineProcess
from benchmarks.hf_baseline import continuous_batching_available, hf_continuous, hf_generate
from benchmarks.llama_cpp_baseline import (
    LlamaCppBudget,
    LlamaCppEngine,
    open_llama_cpp,
    shipped_type,
)
from benchmarks.offline import (
    BLOCK_SIZE,
    OfflineEngine,
    make_runner,
    service_async_scheduling,
    service_speculation,
)
from benchmarks.precision import Precision
from benchmarks.sampling import Sampling
from benchmarks.scales import Scale
from benchmarks.workload import Item
from services.scheduler.scheduler import SchedulerLimits
from services.worker.model.loader import LoadedModel, default_path

HF_SETTING = "float32 (the dequantised GGUF)"


@dataclass(frozen=True, slots=True)
class Job:
    """One workload in one sampling mode, as every side receives it."""

    workload: str
    prompts: list[list[int]]
    outs: list[int]
    sampling: Sampling
    seeds: list[int]  # one per request (benchmarks.sampling.request_seeds)
    in_flight: int  # requests each side may run at once (workload.in_flight)
    scale: Scale


@dataclass(slots=True)
class System:
    """One row's side: warm_up() once (excluded), then run() per timed repeat (seconds)."""

    label: str  # "layerserve", "hf-static", "llama-cpp", ...
    precision: str  # the pairing its row belongs to
    setting: str  # what it computed in, e.g. "bfloat16", "Q4_1 (as shipped)"
    warm_up: Callable[[], object]
    run: Callable[[], float]
    note: str = ""


def engine_systems(job: Job, precision: Precision, loaded: LoadedModel) -> list[System]:
    """layerserve at `precision`, each request with its own SamplingOptions (and seed),
    scheduled and speculating as the scheduler service would on this machine; shared-prefix
    also with the prefix cache off. Every timed run starts with an empty
    prefix cache: only hits within the run count."""
    options = job.sampling.options(job.seeds)
    items = [Item(p, n) for p, n in zip(job.prompts, job.outs, strict=True)]
    runner = make_runner(loaded, blocks_for(items, job.in_flight))
    systems = []
    for caching in (True, False) if job.workload == "shared-prefix" else (True,):
        engine = OfflineEngine(
            runner, limits(job, caching), service_async_scheduling(), *service_speculation()
        )

        def run(engine: OfflineEngine = engine) -> float:
            engine.scheduler.kv.drop_cache()
            started = time.perf_counter()
            engine.generate(job.prompts, job.outs, options)
            return time.perf_counter() - started

        def warm(engine: OfflineEngine = engine) -> None:
            engine.generate(job.prompts[:2], _warm_lens(job), options[:2])

        label = "layerserve" if caching else "layerserve, prefix cache off"
        systems.append(System(label, precision.name, precision.layerserve(), warm, run))
    return systems


def hf_systems(job: Job, hf: BaselineProcess, baselines: tuple, precision: str, gate: dict):
    """(systems, notes of those that cannot run): transformers, one seed per static batch and
    one per continuous-batching run (a batch draws from one torch generator)."""
    kw = (job.sampling, 0)
    systems, skipped = [], {}
    s = job.scale
    if "hf-static" in baselines:
        systems.append(System(
            "hf-static", precision, HF_SETTING,
            lambda: hf.call(hf_generate, job.prompts[:2], _warm_lens(job), 2, 0, *kw),
            lambda: hf.call(hf_generate, job.prompts, job.outs, job.in_flight, 0, *kw)[1],
            "" if job.sampling.greedy else "one seed per batch",
        ))  # fmt: skip
    if "hf-continuous" not in baselines:
        return systems, skipped
    if not _has_continuous(hf):
        skipped["hf-continuous"] = "not in this transformers version: not run"
        return systems, skipped
    seeding = "" if job.sampling.greedy else "; one seed per run"
    systems.append(System(
        "hf-continuous", precision, HF_SETTING,
        lambda: hf.call(hf_continuous, job.prompts[:2], _warm_lens(job), None, None,
                        *kw),
        lambda: hf.call(hf_continuous, job.prompts, job.outs, s.max_num_batched_tokens,
                        job.in_flight, *kw)[1],
        f"gate {gate.get('hf-continuous', 'not run')}{seeding}",
    ))  # fmt: skip
    return systems, skipped


def _has_continuous(hf: BaselineProcess) -> bool:
    if hf.crash is not None:
        return True  # let the row say it crashed
    return hf.call(continuous_batching_available)[0]


def llama_system(job: Job, llama: BaselineProcess, precision: Precision, gate: dict) -> System:
    """llama.cpp with a seed per request, in its child process."""
    sampling, seeds = job.sampling, job.seeds
    setting = precision.llama_cpp(shipped_type(default_path()))
    describe = "" if llama.crash else f"{llama.call(LlamaCppEngine.describe)[0]}; "
    return System(
        "llama-cpp", precision.name, setting,
        lambda: llama.call(LlamaCppEngine.generate, job.prompts[:2], _warm_lens(job),
                           sampling, seeds[:2]),
        lambda: llama.call(LlamaCppEngine.generate, job.prompts, job.outs, sampling, seeds)[1],
        f"{describe}greedy agreement {gate.get('llama-cpp')}",
    )  # fmt: skip


def start_llama_cpp(
    items: list[Item], in_flight: int, scale: Scale, precision: Precision, workdir: Path,
    threads: int,
) -> BaselineProcess:  # fmt: skip
    """llama.cpp's child on the packaged GGUF (or the file type `precision` asks for) with
    layerserve's KV, token, request and thread budgets."""
    budget = LlamaCppBudget(
        n_ctx=blocks_for(items, in_flight) * BLOCK_SIZE,
        n_batch=scale.max_num_batched_tokens,
        n_seq_max=in_flight,
        n_threads=threads,
    )
    return BaselineProcess(
        open_llama_cpp, default_path(), budget, precision.llama_cpp_type, workdir
    )


def _warm_lens(job: Job) -> list[int]:
    """Output lengths of a warm-up on the first (up to) two prompts."""
    return [4] * min(2, len(job.prompts))


def limits(job: Job, caching: bool) -> SchedulerLimits:
    s = job.scale
    return SchedulerLimits(s.max_num_batched_tokens, job.in_flight, enable_prefix_caching=caching)


def blocks_for(items: list[Item], in_flight: int) -> int:
    """KV blocks for the largest `in_flight` requests at once, plus slack."""
    per_request = sorted(-(-(len(i.prompt_ids) + i.output_len) // BLOCK_SIZE) for i in items)
    return sum(per_request[-in_flight:]) + 16
