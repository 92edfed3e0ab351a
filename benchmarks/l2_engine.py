"""L2: the engine offline (scheduler + worker in one process, no RPC) against transformers on
the same model, dtype and pre-tokenised prompts: generate() on static padded batches
(`hf-static`) and transformers' continuous batching (`hf-continuous`); and against llama.cpp
on the same GGUF (`llama-cpp`, benchmarks/llama_cpp_baseline.py). EOS ignored; each workload
runs once per sampling mode (benchmarks/sampling.py: `sampled` as clients do, `greedy`).

A correctness gate comes first: greedy tokens of the engine equal generate()'s on the first
`scale.gate_prompts` prompts; if they do not, no L2 number is measured. llama.cpp's greedy
agreement is reported beside it, on prompts that repeat a pattern, and is not part of the gate:
its quantised dot products are not the dequantised float32 arithmetic both other sides do."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.hf_baseline import continuous_batching_available, hf_continuous, hf_generate
from benchmarks.llama_cpp_baseline import (
    NOT_INSTALLED,
    LlamaCppBudget,
    LlamaCppEngine,
    llama_cpp_available,
)
from benchmarks.offline import BLOCK_SIZE, OfflineEngine, make_runner, service_async_scheduling
from benchmarks.progress import Progress
from benchmarks.sampling import GREEDY, Sampling, request_seeds
from benchmarks.scales import Scale
from benchmarks.workload import Item, build_workload, describe
from services.scheduler.scheduler import SchedulerLimits
from services.worker.model.loader import LoadedModel, default_path

BASELINES = ("hf-static", "hf-continuous", "llama-cpp")


@dataclass(frozen=True, slots=True)
class L2Plan:
    scale: Scale
    seed: int
    workloads: tuple[str, ...]
    baselines: tuple[str, ...]
    repeats: int
    samplings: tuple[Sampling, ...] = (GREEDY,)

    def runs(self) -> int:
        """Timed runs, for the progress bar: the engine (twice for shared-prefix: cache on and
        off) and each baseline, `repeats` times per workload and sampling mode."""
        systems = sum(1 + len(self.baselines) + (w == "shared-prefix") for w in self.workloads)
        return systems * len(self.samplings) * self.repeats


def run_l2(plan: L2Plan, loaded: LoadedModel, hf, progress: Progress) -> dict:
    """{"gate": ..., "rows": [one per workload and system], "workloads": {name: description}}."""
    gate = correctness_gate(plan, loaded, hf, progress)
    result: dict = {"gate": gate, "rows": [], "workloads": {}}
    if not gate["passed"]:
        progress.note(f"L2 correctness gate FAILED ({gate['engine']}): no L2 numbers measured")
        progress.advance(plan.runs())
        return result
    for name in plan.workloads:
        items = build_workload(name, plan.scale, plan.seed)
        result["workloads"][name] = describe(items)
        llama = _llama_engine(plan, items)
        try:
            for sampling in plan.samplings:
                result["rows"] += workload_rows(
                    plan, name, items, sampling, (loaded, hf, llama), gate, progress
                )
        finally:
            if llama is not None:
                llama.close()
    return result


def correctness_gate(plan: L2Plan, loaded: LoadedModel, hf, progress: Progress) -> dict:
    """Greedy tokens of the engine and of hf-continuous against generate() (one prompt at a time,
    no padding) on the first prompts of the first workload."""
    progress.stage("L2 correctness gate")
    items = build_workload(plan.workloads[0], plan.scale, plan.seed)[: plan.scale.gate_prompts]
    prompts, outs = [i.prompt_ids for i in items], [plan.scale.gate_tokens] * len(items)
    reference = hf_generate(hf, prompts, outs, batch_size=1)
    engine = OfflineEngine(make_runner(loaded, _blocks_for(items, plan.scale)), _limits(plan, True))
    ours = engine.generate(prompts, outs)
    same = sum(ours[f"r{i}"] == reference[i] for i in range(len(items)))
    gate = {
        "prompts": len(items),
        "tokens": plan.scale.gate_tokens,
        "engine": f"{same}/{len(items)}",
        "passed": same == len(items),
    }
    if "hf-continuous" in plan.baselines and continuous_batching_available(hf):
        theirs = hf_continuous(hf, prompts, outs)
        same_cb = sum(a == b for a, b in zip(theirs, reference, strict=True))
        gate["hf-continuous"] = f"{same_cb}/{len(items)}"
    llama = _llama_engine(plan, items)
    if llama is not None:
        gate["llama-cpp"] = _llama_cpp_agreement(llama, hf, prompts, outs)
        llama.close()
    progress.note(f"L2 correctness gate: {gate}")
    return gate


def _llama_cpp_agreement(llama: LlamaCppEngine, hf, prompts: list[list[int]], outs: list[int]):
    """Greedy agreement of llama.cpp with generate() on prompts that repeat a short pattern:
    their continuation is near-certain, so only a real fault (positions, sequences, batching)
    and not the rounding of Q4_1 dot products can change a token. On random ids the next-token
    distribution is flat enough that rounding alone flips the argmax."""
    patterned = [(p[:8] * (len(p) // 8 + 2))[: max(len(p), 16)] for p in prompts]
    reference = hf_generate(hf, patterned, outs, batch_size=1)
    theirs = llama.generate(patterned, outs, GREEDY, [0] * len(prompts))
    same = sum(a == b for a, b in zip(theirs, reference, strict=True))
    return f"{same}/{len(prompts)}"


@dataclass(frozen=True, slots=True)
class _Job:
    """One workload in one sampling mode, as every side receives it."""

    prompts: list[list[int]]
    outs: list[int]
    sampling: Sampling
    seeds: list[int]  # one per request (benchmarks.sampling.request_seeds)


Systems = dict[str, Callable[[], object]]


def workload_rows(
    plan: L2Plan,
    name: str,
    items: list[Item],
    sampling: Sampling,
    models: tuple,
    gate: dict,
    progress: Progress,
) -> list[dict]:
    """One row per system for `name` sampled as `sampling` says; models = (our loaded model,
    transformers' model, a LlamaCppEngine or None)."""
    loaded, hf, llama = models
    prompts, outs = [i.prompt_ids for i in items], [i.output_len for i in items]
    job = _Job(prompts, outs, sampling, request_seeds(plan.seed, len(items)))
    systems: Systems = {}
    notes: dict[str, str] = {}
    _add_engine(plan, name, loaded, job, systems)
    _add_hf(plan, hf, job, gate, (systems, notes), progress)
    _add_llama_cpp(plan, llama, job, gate, (systems, notes), progress)
    rows = []
    for system, fn in systems.items():
        progress.stage(f"L2 {name} ({sampling.name}): {system}")
        runs = [_timed(fn, progress) for _ in range(plan.repeats)]
        rows.append(_row(name, sampling.name, system, runs, sum(outs), notes.get(system, "")))
    _add_ratios(rows)
    skipped = [_skipped(name, sampling.name, s, n) for s, n in notes.items() if s not in systems]
    return rows + skipped


def _add_engine(plan: L2Plan, name: str, loaded: LoadedModel, job: _Job, systems: Systems) -> None:
    """layerserve, each request with its own SamplingOptions (and seed); shared-prefix also
    with the prefix cache off."""
    options = job.sampling.options(job.seeds)
    items = [Item(p, n) for p, n in zip(job.prompts, job.outs, strict=True)]
    runner = make_runner(loaded, _blocks_for(items, plan.scale))
    for caching in (True, False) if name == "shared-prefix" else (True,):
        engine = OfflineEngine(runner, _limits(plan, caching), service_async_scheduling())
        engine.generate(job.prompts[:2], [4, 4], options[:2])  # warm-up, excluded
        label = "layerserve" if caching else "layerserve, prefix cache off"
        systems[label] = _fresh_cache_run(engine, job.prompts, job.outs, options)


def _add_hf(plan: L2Plan, hf, job: _Job, gate: dict, out: tuple, progress: Progress) -> None:
    """transformers: one seed per static batch, one per continuous-batching run (a batch
    draws from one torch generator: per-request seeds are impossible there)."""
    systems, notes = out
    kw = {"sampling": job.sampling, "seed": plan.seed}
    prompts, outs, s = job.prompts, job.outs, plan.scale
    if "hf-static" in plan.baselines:
        hf_generate(hf, prompts[:2], [4, 4], batch_size=2, **kw)  # warm-up
        systems["hf-static"] = lambda: hf_generate(
            hf, prompts, outs, batch_size=s.max_num_seqs, **kw
        )
        if not job.sampling.greedy:
            notes["hf-static"] = "one seed per batch"
    if "hf-continuous" not in plan.baselines:
        return
    if not continuous_batching_available(hf):
        notes["hf-continuous"] = "not in this transformers version: not run"
        progress.note("hf-continuous: this transformers has no continuous batching; skipped")
        progress.advance(plan.repeats)
        return
    hf_continuous(hf, prompts[:2], [4, 4], **kw)  # warm-up
    systems["hf-continuous"] = lambda: hf_continuous(
        hf, prompts, outs, s.max_num_batched_tokens, s.max_num_seqs, **kw
    )
    seeding = "" if job.sampling.greedy else "; one seed per run"
    notes["hf-continuous"] = f"gate {gate.get('hf-continuous', 'not run')}{seeding}"


def _add_llama_cpp(plan: L2Plan, llama, job: _Job, gate: dict, out: tuple, progress) -> None:
    """llama.cpp with a seed per request, or a row saying it is not installed."""
    systems, notes = out
    if "llama-cpp" not in plan.baselines:
        return
    if llama is None:
        notes["llama-cpp"] = NOT_INSTALLED
        progress.note(f"llama-cpp: {NOT_INSTALLED}; skipped")
        progress.advance(plan.repeats)
        return
    llama.generate(job.prompts[:2], [4, 4], job.sampling, job.seeds[:2])  # warm-up
    systems["llama-cpp"] = lambda: llama.generate(job.prompts, job.outs, job.sampling, job.seeds)
    notes["llama-cpp"] = f"{llama.describe()}; greedy agreement {gate.get('llama-cpp')}"


def _llama_engine(plan: L2Plan, items: list[Item]) -> LlamaCppEngine | None:
    """llama.cpp on the GGUF layerserve serves, with layerserve's KV, token, request and thread
    budgets; None when not asked for or not installed."""
    if "llama-cpp" not in plan.baselines or not llama_cpp_available():
        return None
    s = plan.scale
    budget = LlamaCppBudget(
        n_ctx=_blocks_for(items, s) * BLOCK_SIZE,
        n_batch=s.max_num_batched_tokens,
        n_seq_max=s.max_num_seqs,
        n_threads=torch.get_num_threads(),
    )
    return LlamaCppEngine(default_path(), budget)


def _fresh_cache_run(engine: OfflineEngine, prompts: list[list[int]], outs: list[int], options):
    """Each timed run starts with an empty prefix cache: only hits within the run count."""

    def run() -> None:
        engine.scheduler.kv.drop_cache()
        engine.generate(prompts, outs, options)

    return run


def _timed(fn: Callable[[], object], progress: Progress) -> float:
    started = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - started
    progress.advance()
    return elapsed


def _row(
    workload: str, sampling: str, system: str, runs: list[float], tokens: int, note: str
) -> dict:
    wall = statistics.median(runs)
    return {
        "workload": workload,
        "sampling": sampling,
        "system": system,
        "wall_s": wall,
        "runs_s": runs,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall,
        "note": note,
    }


def _skipped(workload: str, sampling: str, system: str, note: str) -> dict:
    return {
        "workload": workload,
        "sampling": sampling,
        "system": system,
        "wall_s": None,
        "output_tok_s": None,
        "note": note,
    }


def _add_ratios(rows: list[dict]) -> None:
    """Each row's throughput as a multiple of hf-static's and of llama-cpp's in the same run
    (rows of one workload and sampling mode)."""
    for system, key in (("hf-static", "vs_hf_static"), ("llama-cpp", "vs_llama_cpp")):
        base = next((r["output_tok_s"] for r in rows if r["system"] == system), None)
        for row in rows:
            row[key] = None if base is None else row["output_tok_s"] / base


def _limits(plan: L2Plan, caching: bool) -> SchedulerLimits:
    s = plan.scale
    return SchedulerLimits(s.max_num_batched_tokens, s.max_num_seqs, enable_prefix_caching=caching)


def _blocks_for(items: list[Item], scale: Scale) -> int:
    """KV blocks for the largest `max_num_seqs` requests at once, plus slack."""
    per_request = sorted(-(-(len(i.prompt_ids) + i.output_len) // BLOCK_SIZE) for i in items)
    return sum(per_request[-scale.max_num_seqs :]) + 16
