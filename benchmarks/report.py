"""The outputs of `layerserve bench`: results.json (everything measured) and results.md (the
same as markdown tables; also what --update-docs puts into docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=1) + "\n")


def write_markdown(report: dict, path: Path) -> None:
    path.write_text(render_markdown(report))


def render_markdown(report: dict) -> str:
    """Markdown for a report: the run (command, machine, load, ceilings), then one section per
    level that ran. Missing levels are left out."""
    parts = [_header(report)]
    if report.get("busy"):
        parts.insert(0, _busy_warning(report["busy"], report.get("allow_busy", False)))
    sections = {"l0": _l0, "l1": _l1, "l2": _l2, "l3": _l3}
    for level, render in sections.items():
        if level in report:
            parts.append(render(report[level], report))
    return "\n\n".join(parts) + "\n"


def table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return str(value)


def _header(report: dict) -> str:
    m, c = report["machine"], report["ceilings"]
    load_before, load_after = m["load_average"], report.get("load_average_after")
    gpu = m["gpu"] or "no GPU"
    lines = [
        "Written by `layerserve bench` (benchmarks/cli.py); `--update-docs` rewrites this "
        "section of docs/benchmarks.md from the run.",
        "",
        f"Command: `{report['command']}` (scale `{report['scale']}`, seed {report['seed']}), "
        f"run {report['started_at']} to {report['finished_at']}, commit "
        f"{m['layerserve_commit']}.",
        "",
        f"- **Machine:** {m['cpus']} CPUs ({m['cpu_model']}, {m['machine']}), {gpu}; torch "
        f"threads: {m['torch_threads']}.",
        f"- **Versions:** Python {m['python']}, torch {m['torch']}, transformers "
        f"{m['transformers']}, triton {m['triton']}.",
        f"- **Load average** (1/5/15 min) at the start {_triple(load_before)}, at the end "
        f"{_triple(load_after)}: other work shared the cores when these exceed 0-1.",
        f"- **Ceilings** measured at the start: copy {c['copy_GB_s']:.3g} GB/s, fp32 matmul "
        f"{c['matmul_GFLOP_s']:.3g} GFLOP/s.",
        f"- **Model:** {report['model']}; {_precisions(report)}; EOS ignored, each request "
        "gets exactly its output length; warm-up runs are excluded; each figure is the median "
        f"of {report['repeats']} runs.",
        f"- **Sampling** (every side, each workload once per mode): {_samplings(report)}.",
    ]
    return "\n".join(lines)


def _precisions(report: dict) -> str:
    """Each pairing's formats (benchmarks/precision.py), or the one dtype of older reports."""
    pairings = report.get("precisions")
    if not pairings:
        return report["dtype"]
    text = "; ".join(
        f"`{name}`: layerserve {p['layerserve']} ({p['reason']}), llama.cpp {p['llama_cpp']}"
        for name, p in pairings.items()
    )
    return f"precision pairings (L2 runs each; L3's worker the first): {text}; L1 float32"


def _samplings(report: dict) -> str:
    modes = report.get("samplings") or {"greedy": "greedy"}
    return "; ".join(f"`{name}`: {text}" for name, text in modes.items())


def _busy_warning(reason: str, allowed: bool) -> str:
    how = " (recorded with `--allow-busy`)" if allowed else ""
    return (
        f"> **Measured on a busy machine**{how}: {reason}. Other work shared the cores, so "
        "these figures understate every side and their ratios are noisier."
    )


def _triple(values: list[float] | None) -> str:
    return "n/a" if values is None else " / ".join(f"{v:.2f}" for v in values)


def _l0(l0: dict, report: dict) -> str:
    if l0["dry_run"]:
        intro = (
            "### L0 kernels: DRY RUN (no GPU)\n\nThe kernel benchmarks ran in the Triton "
            "interpreter on tiny shapes: they prove the kernels run and agree with torch. "
            "Their timings measure the interpreter, not the kernels."
        )
    else:
        intro = "### L0 kernels"
    blocks = [intro]
    for script in l0["scripts"]:
        status = "ok" if script["exit_code"] == 0 else f"FAILED (exit {script['exit_code']})"
        blocks.append(f"`python -m {script['module']}`: {status}\n\n{script['output']}")
    return "\n\n".join(blocks)


def _l1(l1: dict, report: dict) -> str:
    rows = [
        [r["batch"], r["context"], r["prefill_ms"], r["decode_step_ms"], r["decode_tok_s"],
         r["step_GB"], f"{100 * r['mbu']:.0f}%", r["busy_share"]]
        for r in l1["rows"]
    ]  # fmt: skip
    head = ["batch", "context", "prefill ms", "decode step ms", "decode tok/s", "GB read / step",
            "MBU", "device-busy share"]  # fmt: skip
    return (
        "### L1 worker: one static batch\n\n"
        f"Prefill of the whole batch in one step, then {l1['decode_steps']} decode steps "
        "(per-step median). MBU = (weights + KV read per decode step) / step time / the copy "
        "bandwidth above. The device-busy share is n/a on the CPU.\n\n" + table(head, rows)
    )


def _l2(l2: dict, report: dict) -> str:
    gate = l2["gate"]
    lines = [
        "### L2 engine offline vs transformers",
        "",
        f"Correctness gate: {gate['engine']} prompts give identical {gate['tokens']} greedy "
        f"tokens to transformers `generate()`"
        + (f"; hf-continuous {gate['hf-continuous']}" if "hf-continuous" in gate else "")
        + ("." if gate["passed"] else ": FAILED, no L2 numbers.")
        + (
            f" llama-cpp agrees on {gate['llama-cpp']} prompts that repeat a pattern (its "
            "quantised arithmetic differs from the dequantised float32 both other sides run, "
            "enough to flip near-ties on random ids: reported, not gated)."
            if "llama-cpp" in gate
            else ""
        ),
        "",
    ]
    lines += [f"- `{name}`: {text}" for name, text in l2["workloads"].items()]
    rows = [
        [r["workload"], r.get("sampling", "greedy"), r.get("precision", "equal"), r["system"],
         r.get("setting", "float32"), r["wall_s"], _runs(r.get("runs_s")), r["output_tok_s"],
         _ratio(r.get("vs_hf_static")), _ratio(r.get("vs_llama_cpp")),
         ("**CRASHED** " if r.get("crashed") else "") + r["note"]]
        for r in l2["rows"]
    ]  # fmt: skip
    head = ["workload", "sampling", "pairing", "system", "ran at", "wall s", "runs s",
            "output tok/s", "vs hf-static", "vs llama-cpp (same pairing)", "note"]  # fmt: skip
    return "\n".join(lines) + "\n\n" + table(head, rows)


def _ratio(value: float | None) -> str | None:
    return None if value is None else f"{value:.2f}x"


def _runs(runs: list[float] | None) -> str:
    return "n/a" if not runs else ", ".join(f"{x:.1f}" for x in runs)


def _l3(l3: dict, report: dict) -> str:
    slo = report["slo"]
    throughput = [
        [r["workload"], r.get("sampling", "greedy"), "on" if r["prefix_cache"] else "off",
         _point(r), r["requests_s"], r["output_tok_s"], r.get("l3_over_l2"),
         f"{100 * r['slo_attained']:.0f}%", r["goodput_requests_s"]]
        for r in l3["rows"]
    ]  # fmt: skip
    head = ["workload", "sampling", "prefix cache", "load", "req/s", "output tok/s", "L3/L2",
            "SLO met", "goodput req/s"]  # fmt: skip
    latency = [
        [
            r["workload"],
            r.get("sampling", "greedy"),
            "on" if r["prefix_cache"] else "off",
            _point(r),
        ]
        + [_ms(r[key]) for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")]
        for r in l3["rows"]
    ]
    lat_head = ["workload", "sampling", "prefix cache", "load"] + [
        f"{name} ms mean / p50 / p99" for name in ("TTFT", "TPOT", "ITL", "end-to-end")
    ]
    return (
        "### L3 through the gateway (streaming)\n\n"
        f"Goodput counts requests with TTFT <= {slo['ttft_ms']:g} ms and TPOT <= "
        f"{slo['tpot_ms']:g} ms. L3/L2 is output tok/s over the L2 engine's on the same "
        "workload and sampling; L2 has every request in flight at once, so the ratio is like "
        "for like only where the concurrency covers all requests (a lower one caps throughput "
        "by design). "
        "Redis off (one replica).\n\n" + table(head, throughput) + "\n\n" + table(lat_head, latency)
    )


def _point(row: dict) -> str:
    if row["mode"] == "poisson":
        return f"Poisson {row['rate']:g} req/s"
    return f"concurrency {row['concurrency']}"


def _ms(stats: dict) -> str:
    return " / ".join(_cell(float(stats[k])) for k in ("mean", "p50", "p99"))
