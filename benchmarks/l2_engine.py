"""L2: the engine offline (scheduler + worker in one process, no RPC) against transformers on
the same model and pre-tokenised prompts: generate() on static padded batches (`hf-static`)
and transformers' continuous batching (`hf-continuous`); and against llama.cpp on the same
GGUF (`llama-cpp`, benchmarks/llama_cpp_baseline.py). EOS ignored; each workload runs once per
sampling mode (benchmarks/sampling.py: `sampled` as clients do, `greedy`) and layerserve and
llama.cpp once per precision pairing (benchmarks/precision.py: each at its default, and both
at equal precision). Every baseline runs in a child process of its own: one that crashes gets
a row that says so, and the run goes on.

The correctness gate comes first (benchmarks/l2_gate.py). The timed runs are interleaved:
each repeat runs every side once, so a change in the machine's load hits all of them."""

from __future__ import annotations

import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.baseline_process import BaselineCrashed, BaselineProcess
from benchmarks.hf_baseline import load_hf
from benchmarks.l2_gate import correctness_gate
from benchmarks.l2_sides import (
    Job,
    System,
    engine_systems,
    hf_systems,
    limits,
    llama_system,
    start_llama_cpp,
)
from benchmarks.llama_cpp_baseline import NOT_INSTALLED, llama_cpp_available, shipped_type
from benchmarks.precision import Precision, load_layerserve
from benchmarks.progress import Progress
from benchmarks.sampling import GREEDY, Sampling, request_seeds
from benchmarks.scales import Scale
from benchmarks.workload import Item, build_workload, describe, in_flight
from services.worker.model.loader import LoadedModel, default_path

BASELINES = ("hf-static", "hf-continuous", "llama-cpp")
HF_BASELINES = ("hf-static", "hf-continuous")


@dataclass(frozen=True, slots=True)
class L2Plan:
    scale: Scale
    seed: int
    workloads: tuple[str, ...]
    baselines: tuple[str, ...]
    repeats: int
    samplings: tuple[Sampling, ...] = (GREEDY,)
    precisions: tuple[Precision, ...] = ()  # layerserve and llama.cpp run once per pairing
    threads: int = 0  # torch's (and llama.cpp's) threads; 0: torch's default

    def runs(self) -> int:
        """Timed runs, for the progress bar: per workload and sampling mode, the engine
        (twice for shared-prefix: cache on and off) and llama.cpp once per precision pairing,
        transformers' baselines once, `repeats` times each."""
        per_pairing = "llama-cpp" in self.baselines
        hf = sum(b in self.baselines for b in HF_BASELINES)
        systems = sum(
            (1 + per_pairing + (w == "shared-prefix")) * len(self.precisions) + hf
            for w in self.workloads
        )
        return systems * len(self.samplings) * self.repeats


def run_l2(plan: L2Plan, loaded: LoadedModel, progress: Progress) -> dict:
    """{"gate": ..., "rows": [one per workload, sampling, pairing and system], "workloads":
    {name: description}}. loaded: the model in float32 (the gate's and `equal`'s)."""
    models = {p.name: _model_at(p, loaded, progress) for p in plan.precisions}
    hf = BaselineProcess(load_hf, "float32", plan.threads)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-l2-") as workdir:
            return _measure_all(plan, loaded, models, hf, Path(workdir), progress)
    finally:
        hf.close()


def _measure_all(plan: L2Plan, loaded, models: dict, hf: BaselineProcess, workdir: Path,
                 progress: Progress) -> dict:  # fmt: skip
    items = build_workload(plan.workloads[0], plan.scale, plan.seed)[: plan.scale.gate_prompts]
    gate_limits = limits(_job(plan, plan.workloads[0], items, GREEDY), True)
    llama = _llama_cpp(plan, plan.workloads[0], items, plan.precisions[0], workdir)
    try:
        gate = correctness_gate(
            items, plan.scale.gate_tokens, gate_limits, loaded, hf, llama, progress,
            "hf-continuous" in plan.baselines,
        )  # fmt: skip
    finally:
        if llama is not None:
            llama.close()
    result: dict = {"gate": gate, "rows": [], "workloads": {}}
    if not gate["passed"]:
        progress.note(f"L2 correctness gate FAILED ({gate['engine']}): no L2 numbers measured")
        progress.advance(plan.runs())
        return result
    for name in plan.workloads:
        items = build_workload(name, plan.scale, plan.seed)
        result["workloads"][name] = describe(items)
        llamas = {p.name: _llama_cpp(plan, name, items, p, workdir) for p in plan.precisions}
        try:
            for sampling in plan.samplings:
                job = _job(plan, name, items, sampling)
                result["rows"] += workload_rows(plan, job, models, hf, llamas, gate, progress)
        finally:
            for process in llamas.values():
                if process is not None:
                    process.close()
    return result


def _model_at(precision: Precision, loaded: LoadedModel, progress: Progress) -> LoadedModel:
    if precision.dtype == "float32" and precision.quantization == "none":
        return loaded
    progress.stage(f"loading the model in {precision.layerserve()}")
    return load_layerserve(precision)


def _job(plan: L2Plan, name: str, items: list[Item], sampling: Sampling) -> Job:
    prompts, outs = [i.prompt_ids for i in items], [i.output_len for i in items]
    seeds = request_seeds(plan.seed, len(items))
    return Job(name, prompts, outs, sampling, seeds, in_flight(name, plan.scale), plan.scale)


def _llama_cpp(plan: L2Plan, name: str, items: list[Item], precision: Precision, workdir: Path):
    """llama.cpp's child for the named workload's items at `precision`; None when not asked
    for or not installed."""
    if "llama-cpp" not in plan.baselines or not llama_cpp_available():
        return None
    threads = plan.threads or torch.get_num_threads()
    width = in_flight(name, plan.scale)
    return start_llama_cpp(items, width, plan.scale, precision, workdir, threads)


def workload_rows(
    plan: L2Plan,
    job: Job,
    models: dict[str, LoadedModel],
    hf: BaselineProcess,
    llamas: dict[str, BaselineProcess | None],
    gate: dict,
    progress: Progress,
) -> list[dict]:
    """One row per system and pairing for `job`, ratios within its pairing."""
    systems: list[System] = []
    skipped: list[dict] = []
    for precision in plan.precisions:
        systems += engine_systems(job, precision, models[precision.name])
        if "llama-cpp" not in plan.baselines:
            continue
        llama = llamas.get(precision.name)
        if llama is None:
            setting = precision.llama_cpp(shipped_type(default_path()))
            skipped.append(_row(job, "llama-cpp", precision.name, setting, [], NOT_INSTALLED))
        else:
            systems.append(llama_system(job, llama, precision, gate))
    hf_pairing = "equal" if "equal" in models else plan.precisions[0].name
    hf_made, hf_skipped = hf_systems(job, hf, plan.baselines, hf_pairing, gate)
    systems += hf_made
    skipped += [_row(job, s, hf_pairing, "", [], note) for s, note in hf_skipped.items()]
    progress.advance(plan.repeats * len(skipped))
    rows = measure(systems, job, plan.repeats, progress)
    _add_ratios(rows)
    return rows + skipped


def measure(systems: list[System], job: Job, repeats: int, progress: Progress) -> list[dict]:
    """Warm-ups first, then `repeats` rounds, each running every side once (interleaved). A
    side whose process crashes gets a row that says so; the others go on."""
    crashed: dict[int, str] = {}
    runs: dict[int, list[float]] = {i: [] for i in range(len(systems))}
    for i, system in enumerate(systems):
        progress.stage(f"L2 {job.workload} ({job.sampling.name}): warming up {system.label}")
        _attempt(system.warm_up, i, crashed, progress, repeats)
    for _ in range(repeats):
        for i, system in enumerate(systems):
            if i in crashed:
                continue
            progress.stage(f"L2 {job.workload} ({job.sampling.name}, {system.precision}): "
                           f"{system.label}")  # fmt: skip
            left = repeats - len(runs[i])
            seconds = _attempt(system.run, i, crashed, progress, left)
            if seconds is not None:
                runs[i].append(seconds)
                progress.advance()
    return [
        _row(job, s.label, s.precision, s.setting, runs[i], crashed.get(i, s.note),
             crashed=i in crashed)
        for i, s in enumerate(systems)
    ]  # fmt: skip


def _attempt(fn, index: int, crashed: dict[int, str], progress: Progress, left: int):
    try:
        return fn()
    except BaselineCrashed as err:
        crashed[index] = str(err)
        progress.note(f"L2: a baseline {err}; its row says so, the run goes on")
        progress.advance(left)
        return None


def _row(job: Job, system: str, precision: str, setting: str, runs: list[float], note: str,
         crashed: bool = False) -> dict:  # fmt: skip
    wall = statistics.median(runs) if runs and not crashed else None
    tokens = sum(job.outs)
    return {
        "workload": job.workload,
        "sampling": job.sampling.name,
        "precision": precision,
        "system": system,
        "setting": setting,
        "wall_s": wall,
        "runs_s": runs,
        "output_tokens": tokens,
        "output_tok_s": None if wall is None else tokens / wall,
        "crashed": crashed,
        "note": note,
    }


def _add_ratios(rows: list[dict]) -> None:
    """Each row's throughput as a multiple of hf-static's (whatever the pairing: transformers
    runs once) and of llama-cpp's in the same pairing, in the same run."""
    hf = next((r["output_tok_s"] for r in rows if r["system"] == "hf-static"), None)
    for row in rows:
        llama = next(
            (r["output_tok_s"] for r in rows
             if r["system"] == "llama-cpp" and r["precision"] == row["precision"]),
            None,
        )  # fmt: skip
        row["vs_hf_static"] = _over(row["output_tok_s"], hf)
        row["vs_llama_cpp"] = _over(row["output_tok_s"], llama)


def _over(value: float | None, base: float | None) -> float | None:
    return None if value is None or not base else value / base
