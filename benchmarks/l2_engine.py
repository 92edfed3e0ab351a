"""L2: the engine offline (scheduler + worker in one process, no RPC) against transformers on
the same model, dtype and pre-tokenised prompts: generate() on static padded batches
(`hf-static`) and transformers' continuous batching (`hf-continuous`), greedy, EOS ignored.

A correctness gate comes first: greedy tokens of the engine equal generate()'s on the first
`scale.gate_prompts` prompts; if they do not, no L2 number is measured."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.hf_baseline import continuous_batching_available, hf_continuous, hf_generate
from benchmarks.offline import BLOCK_SIZE, OfflineEngine, make_runner
from benchmarks.progress import Progress
from benchmarks.scales import Scale
from benchmarks.workload import Item, build_workload, describe
from services.scheduler.scheduler import SchedulerLimits
from services.worker.model.loader import LoadedModel

BASELINES = ("hf-static", "hf-continuous")


@dataclass(frozen=True, slots=True)
class L2Plan:
    scale: Scale
    seed: int
    workloads: tuple[str, ...]
    baselines: tuple[str, ...]
    repeats: int

    def runs(self) -> int:
        """Timed runs, for the progress bar: the engine (twice for shared-prefix: cache on and
        off) and each baseline, `repeats` times per workload."""
        systems = sum(1 + len(self.baselines) + (w == "shared-prefix") for w in self.workloads)
        return systems * self.repeats


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
        result["rows"] += workload_rows(plan, name, items, loaded, hf, gate, progress)
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
    progress.note(f"L2 correctness gate: {gate}")
    return gate


def workload_rows(
    plan: L2Plan, name: str, items: list[Item], loaded: LoadedModel, hf, gate: dict, progress
) -> list[dict]:
    prompts, outs = [i.prompt_ids for i in items], [i.output_len for i in items]
    runner = make_runner(loaded, _blocks_for(items, plan.scale))
    systems: dict[str, Callable[[], object]] = {}
    for caching in (True, False) if name == "shared-prefix" else (True,):
        engine = OfflineEngine(runner, _limits(plan, caching))
        engine.generate(prompts[:2], [4, 4])  # warm-up, excluded
        label = "layerserve" if caching else "layerserve, prefix cache off"
        systems[label] = _fresh_cache_run(engine, prompts, outs)
    notes: dict[str, str] = {}
    if "hf-static" in plan.baselines:
        hf_generate(hf, prompts[:2], [4, 4], batch_size=2)  # warm-up
        batch = plan.scale.max_num_seqs
        systems["hf-static"] = lambda: hf_generate(hf, prompts, outs, batch_size=batch)
    if "hf-continuous" in plan.baselines:
        if continuous_batching_available(hf):
            hf_continuous(hf, prompts[:2], [4, 4])  # warm-up
            systems["hf-continuous"] = lambda: hf_continuous(
                hf, prompts, outs, plan.scale.max_num_batched_tokens, plan.scale.max_num_seqs
            )
            notes["hf-continuous"] = f"gate {gate.get('hf-continuous', 'not run')}"
        else:
            notes["hf-continuous"] = "not in this transformers version: not run"
            progress.note("hf-continuous: this transformers has no continuous batching; skipped")
            progress.advance(plan.repeats)
    rows = []
    for system, fn in systems.items():
        progress.stage(f"L2 {name}: {system}")
        runs = [_timed(fn, progress) for _ in range(plan.repeats)]
        rows.append(_row(name, system, runs, sum(outs), notes.get(system, "")))
    _add_ratios(rows)
    return rows + [_skipped(name, s, n) for s, n in notes.items() if s not in systems]


def _fresh_cache_run(engine: OfflineEngine, prompts: list[list[int]], outs: list[int]):
    """Each timed run starts with an empty prefix cache: only hits within the run count."""

    def run() -> None:
        engine.scheduler.kv.drop_cache()
        engine.generate(prompts, outs)

    return run


def _timed(fn: Callable[[], object], progress: Progress) -> float:
    started = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - started
    progress.advance()
    return elapsed


def _row(workload: str, system: str, runs: list[float], tokens: int, note: str) -> dict:
    wall = statistics.median(runs)
    return {
        "workload": workload,
        "system": system,
        "wall_s": wall,
        "runs_s": runs,
        "output_tokens": tokens,
        "output_tok_s": tokens / wall,
        "note": note,
    }


def _skipped(workload: str, system: str, note: str) -> dict:
    return {
        "workload": workload,
        "system": system,
        "wall_s": None,
        "output_tok_s": None,
        "note": note,
    }


def _add_ratios(rows: list[dict]) -> None:
    """Each row's throughput as a multiple of hf-static's in the same run."""
    base = next((r["output_tok_s"] for r in rows if r["system"] == "hf-static"), None)
    for row in rows:
        row["vs_hf_static"] = None if base is None else row["output_tok_s"] / base


def _limits(plan: L2Plan, caching: bool) -> SchedulerLimits:
    s = plan.scale
    return SchedulerLimits(s.max_num_batched_tokens, s.max_num_seqs, enable_prefix_caching=caching)


def _blocks_for(items: list[Item], scale: Scale) -> int:
    """KV blocks for the largest `max_num_seqs` requests at once, plus slack."""
    per_request = sorted(-(-(len(i.prompt_ids) + i.output_len) // BLOCK_SIZE) for i in items)
    return sum(per_request[-scale.max_num_seqs :]) + 16
