"""`layerserve bench`: L0 kernels, L1 worker, L2 engine offline and L3 service through the
gateway in one run, each beside its baseline measured in the same run, on seeded
pre-tokenised workloads (docs/benchmarks.md says what each level reports).

    layerserve bench                                  # L1, L2, L3 of `mixed` at the CPU scale
    layerserve bench --level l2 --scale tiny          # a smoke test
    layerserve bench --level l0,l1,l2,l3 --workload mixed,shared-prefix --scale full
    layerserve bench --level l2 --workload long-context --baselines hf-static,llama-cpp
    layerserve bench --sampling sampled               # half the rows: no greedy second row
    layerserve bench --level l2 --workload single-stream,mixed --scale small-16 --threads 1
    layerserve bench --precision equal                # both sides float32 only
    layerserve bench ... --update-docs                # also regenerate docs/benchmarks.md's section

Writes results.json, results.md and latency_throughput.png to --out; a progress bar on
stderr. Exits 1 when a correctness gate or a kernel check fails (the numbers do not count).
--update-docs refuses to start (exit 3) on a busy machine unless --allow-busy says otherwise."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.docs_section import update_docs
from benchmarks.l0_kernels import l0_runs, run_l0
from benchmarks.l1_worker import L1Plan, run_l1
from benchmarks.l2_engine import BASELINES, L2Plan, run_l2
from benchmarks.l3_service import L3Plan, run_l3
from benchmarks.machine import busy_reason, ceilings, load_average, machine
from benchmarks.metrics import Slo
from benchmarks.offline import MODEL
from benchmarks.plot import plot_latency_throughput
from benchmarks.precision import Precision, add_flags, from_flags
from benchmarks.progress import Progress
from benchmarks.sampling import SAMPLINGS, Sampling, sampling_named
from benchmarks.scales import SCALES, Scale, scale_named
from benchmarks.workload import WORKLOADS
from services.common.env import env_str

LEVELS = ("l0", "l1", "l2", "l3")
DOCS_IMAGE = "benchmarks_latency_throughput.png"  # beside docs/benchmarks.md


@dataclass(frozen=True, slots=True)
class BenchConfig:
    levels: tuple[str, ...]
    workloads: tuple[str, ...]
    scale: Scale
    seed: int
    repeats: int
    concurrency: tuple[int, ...]
    rates: tuple[float, ...]
    slo: Slo
    baselines: tuple[str, ...]
    out: Path
    docs: Path | None  # None: leave the docs alone
    progress: bool
    command: str
    threads: int  # torch intra-op threads here and in L3's worker; 0: torch's default
    samplings: tuple[Sampling, ...]  # each workload runs once per mode, in this order
    allow_busy: bool  # --update-docs even when the machine was busy at the start
    precisions: tuple[Precision, ...]  # L2's pairings (benchmarks/precision.py); L3: the first


def parse_config(argv: list[str]) -> BenchConfig:
    """BenchConfig from flags (LAYERSERVE_BENCH_SCALE / _OUT as defaults); ValueError names the
    flag that is wrong."""
    a = _parser().parse_args(argv)
    scale = scale_named(a.scale)
    levels = _choices("--level", a.level, LEVELS)
    baselines = () if a.baselines == "none" else _choices("--baselines", a.baselines, BASELINES)
    concurrency = scale.concurrency if a.concurrency is None else _numbers(a.concurrency, int)
    rates = scale.rates if a.rates is None else _numbers(a.rates, float)
    if any(c < 1 for c in concurrency) or any(r <= 0 for r in rates):
        raise ValueError("--concurrency needs integers >= 1 and --rates numbers > 0")
    if "l3" in levels and not concurrency + rates:
        raise ValueError("L3 needs at least one --concurrency or --rates point")
    repeats = scale.repeats if a.repeats is None else a.repeats
    if repeats < 1 or a.slo_ttft_ms <= 0 or a.slo_tpot_ms <= 0:
        raise ValueError("--repeats, --slo-ttft-ms and --slo-tpot-ms must be positive")
    if a.threads < 0:
        raise ValueError("--threads must be >= 0 (0: torch's default)")
    return BenchConfig(
        levels=levels,
        workloads=_choices("--workload", a.workload, WORKLOADS),
        scale=scale,
        seed=a.seed,
        repeats=repeats,
        concurrency=concurrency,
        rates=rates,
        slo=Slo(a.slo_ttft_ms / 1000, a.slo_tpot_ms / 1000),
        baselines=baselines,
        out=Path(a.out),
        docs=Path(a.docs) if a.update_docs else None,
        progress=not a.no_progress,
        command=shlex.join(["layerserve", "bench", *argv]),
        threads=a.threads,
        samplings=tuple(
            sampling_named(n) for n in _choices("--sampling", a.sampling, tuple(SAMPLINGS))
        ),
        allow_busy=a.allow_busy,
        precisions=from_flags(a),
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="layerserve bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--level", default="l1,l2,l3", help="any of l0,l1,l2,l3 (comma-separated)")
    p.add_argument("--workload", default="mixed", help=f"any of {','.join(WORKLOADS)}")
    p.add_argument("--seed", type=int, default=0, help="workloads and Poisson arrivals")
    p.add_argument(
        "--scale",
        default=env_str("BENCH_SCALE", "small"),
        help=f"{', '.join(SCALES)} (benchmarks/scales.py): small fits a 2-core CPU in minutes; "
        "full is 256 requests of 100..1024 tokens and the other full-size workloads",
    )
    p.add_argument("--repeats", type=int, help="runs per figure, median taken (scale's default)")
    p.add_argument("--concurrency", help="L3 max-concurrency sweep, e.g. 1,8,32")
    p.add_argument("--rates", help="L3 Poisson arrival rates in requests/s, e.g. 0.5,2")
    p.add_argument("--slo-ttft-ms", type=float, default=3000.0, help="goodput SLO on TTFT")
    p.add_argument("--slo-tpot-ms", type=float, default=300.0, help="goodput SLO on TPOT")
    p.add_argument(
        "--baselines", default=",".join(BASELINES), help=f"any of {','.join(BASELINES)}, or none"
    )
    p.add_argument("--out", default=env_str("BENCH_OUT", "bench-out"), help="output folder")
    p.add_argument("--update-docs", action="store_true", help="regenerate --docs' bench section")
    p.add_argument("--docs", default="docs/benchmarks.md", help="the file --update-docs edits")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads for every side and L3's worker (0: torch's default); on a shared, "
        "oversubscribed box 1 avoids OpenMP threads waiting on descheduled peers",
    )
    p.add_argument(
        "--sampling",
        default="sampled,greedy",
        help="sampled (temperature 0.7, top_p 0.95, a seed per request, as clients do) and/or "
        "greedy: each workload runs once per mode, on every side; the correctness gate is "
        "greedy whatever this says",
    )
    p.add_argument(
        "--allow-busy",
        action="store_true",
        help="--update-docs even when the 1-minute load average at the start exceeds half the "
        "cores; the docs then say the run was measured on a busy machine",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_flags(p)
    return p


def _choices(flag: str, text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    unknown = [x for x in chosen if x not in allowed]
    if unknown or not chosen:
        raise ValueError(f"{flag}: {', '.join(unknown) or 'nothing'} not in {', '.join(allowed)}")
    return chosen


def _numbers(text: str, kind: type) -> tuple:
    try:
        return tuple(kind(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"not a list of numbers: {text!r}") from None


def run(config: BenchConfig, load_at_start: list[float] | None = None) -> dict:
    """Every level asked for, in order; the report that the writers take. `load_at_start`: the
    load average already judged by main() (measured here when None)."""
    l1 = L1Plan(config.scale, config.seed, config.repeats)
    l2 = L2Plan(
        config.scale, config.seed, config.workloads, config.baselines, config.repeats,
        config.samplings, config.precisions, config.threads,
    )  # fmt: skip
    l3 = L3Plan(
        config.scale, config.seed, config.workloads, config.concurrency, config.rates,
        config.slo, config.repeats, config.threads, config.samplings, config.precisions[0],
    )  # fmt: skip
    if config.threads:
        import torch

        torch.set_num_threads(config.threads)
    runs = {"l0": l0_runs(), "l1": l1.runs(), "l2": l2.runs(), "l3": l3.runs()}
    progress = Progress(sum(runs[level] for level in config.levels), config.progress)
    progress.stage("measuring the machine's ceilings")
    report = _report_head(config, load_average() if load_at_start is None else load_at_start)
    try:
        if "l0" in config.levels:
            report["l0"] = run_l0(progress)
        if "l1" in config.levels or "l2" in config.levels:
            loaded = _load_model(progress)
            if "l1" in config.levels:
                report["l1"] = run_l1(l1, loaded, report["ceilings"]["copy_GB_s"], progress)
            if "l2" in config.levels:
                report["l2"] = run_l2(l2, loaded, progress)
            del loaded  # L3's worker is its own process: leave it the memory
        if "l3" in config.levels:
            report["l3"] = run_l3(l3, progress)
            _add_l3_over_l2(report)
    finally:
        progress.close()
    report["finished_at"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    report["load_average_after"] = load_average()
    return report


def _report_head(config: BenchConfig, load: list[float]) -> dict:
    cpus = os.cpu_count() or 1
    busy = busy_reason(load[0], cpus)
    return {
        "command": config.command,
        "scale": config.scale.name,
        "seed": config.seed,
        "levels": list(config.levels),
        "workloads": list(config.workloads),
        "model": MODEL,
        "dtype": "float32",  # L1's and the gate's; L2 and L3 run at `precisions`
        "precisions": {
            p.name: {
                "layerserve": p.layerserve(),
                "llama_cpp": p.llama_cpp_type,
                "reason": p.reason,
            }
            for p in config.precisions
        },  # fmt: skip
        "repeats": config.repeats,
        "samplings": {s.name: s.describe() for s in config.samplings},
        "slo": {"ttft_ms": 1000 * config.slo.ttft_s, "tpot_ms": 1000 * config.slo.tpot_s},
        "started_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": machine() | {"load_average": load},
        "busy": busy,  # None: quiet at the start; else why the machine counts as busy
        "allow_busy": config.allow_busy,
        "ceilings": ceilings(),
    }


def _load_model(progress: Progress):
    """SmolLM2-135M from the packaged GGUF on the CPU in float32 (L1's and the L2 gate's;
    transformers loads its own copy in its child process)."""
    import torch

    from services.worker.model.loader import default_path, load_model

    progress.stage("loading the model")
    return load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))


def _add_l3_over_l2(report: dict) -> None:
    """Each L3 row's output tok/s over the L2 engine's on the same workload (prefix cache as
    in the row): the price of the microservice split."""
    pairing = next(iter(report.get("precisions", {"default": None})))  # L3's worker's
    l2 = {
        (r["workload"], r["sampling"], r["system"] == "layerserve"): r["output_tok_s"]
        for r in report.get("l2", {}).get("rows", [])
        if r["system"] in ("layerserve", "layerserve, prefix cache off")
        and r["output_tok_s"]
        and r.get("precision", pairing) == pairing
    }
    for row in report["l3"]["rows"]:
        base = l2.get((row["workload"], row["sampling"], row["prefix_cache"]))
        row["l3_over_l2"] = None if base is None else row["output_tok_s"] / base


def write_outputs(report: dict, config: BenchConfig) -> list[Path]:
    from benchmarks.report import render_markdown, write_json, write_markdown

    config.out.mkdir(parents=True, exist_ok=True)
    paths = [config.out / "results.json", config.out / "results.md"]
    write_json(report, paths[0])
    write_markdown(report, paths[1])
    png = config.out / "latency_throughput.png"
    if plot_latency_throughput(report, png):
        paths.append(png)
    if config.docs is not None:
        section = render_markdown(report)
        if png.exists():
            shutil.copyfile(png, config.docs.parent / DOCS_IMAGE)
            section += f"\n![L3 latency against throughput]({DOCS_IMAGE})\n"
        update_docs(config.docs, "## `layerserve bench` (issue 7)\n\n" + section)
        paths.append(config.docs)
    return paths


def failures(report: dict) -> list[str]:
    """What makes the numbers not count: a failed gate or kernel check."""
    found = []
    if "l2" in report and not report["l2"]["gate"]["passed"]:
        found.append("L2 correctness gate failed")
    for script in report.get("l0", {}).get("scripts", []):
        if script["exit_code"] != 0:
            found.append(f"L0 {script['module']} failed")
    return found


def docs_refusal(config: BenchConfig, load_1min: float, cpus: int) -> str | None:
    """Why --update-docs must not run now, or None. A run that starts on a busy machine does
    not go into the docs unless --allow-busy says so (the docs then mark it)."""
    busy = busy_reason(load_1min, cpus)
    if config.docs is None or busy is None or config.allow_busy:
        return None
    return (
        f"refusing --update-docs: {busy}; other work would be measured with the engine. Wait "
        "for a quiet machine, or pass --allow-busy to record it marked as a busy-machine run"
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        config = parse_config(argv)
    except ValueError as err:
        print(f"layerserve bench: {err}", file=sys.stderr)
        return 2
    load = load_average()
    refusal = docs_refusal(config, load[0], os.cpu_count() or 1)
    if refusal:
        print(f"layerserve bench: {refusal}", file=sys.stderr)
        return 3
    report = run(config, load)
    for path in write_outputs(report, config):
        print(f"wrote {path}")
    problems = failures(report)
    for problem in problems:
        print(f"layerserve bench: {problem}: these numbers do not count", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
