"""report.md of the GPU check: one heading per section, its status, then its tables; last, the
verdict table (one PASS/FAIL row per goal, benchmarks/gpu_verdicts.py)."""

from __future__ import annotations

from benchmarks.gpu_verdicts import verdict_table

SECTIONS = ("environment", "tests", "ceilings", "attention", "small_ops", "models")

MODEL_COLUMNS = (
    ("model", "model", "{}"), ("steps", "mode", "{}"), ("batch", "batch", "{}"),
    ("prompt+new", None, "{}"), ("ours decode tok/s", "ours_decode_tok_s", "{:.0f}"),
    ("ours e2e tok/s", "ours_e2e_tok_s", "{:.0f}"), ("step ms", "ours_step_ms", "{:.2f}"),
    ("MBU", "mbu", "{:.0%}"), ("GPU busy", "busy_share", "{:.0%}"),
    ("HF decode tok/s", "hf_decode_tok_s", "{:.0f}"), ("HF e2e tok/s", "hf_e2e_tok_s", "{:.0f}"),
    ("greedy = HF", "greedy_same_as_hf", "{}"),
)  # fmt: skip


def rows_of(text: str) -> list[dict]:
    """The rows of every markdown table in a benchmark's output, as dicts by header."""
    rows, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif set("".join(cells)) <= set("- "):
            continue
        else:
            rows.append(dict(zip(header, cells, strict=False)))
    return rows


def _cell(row: dict, key: str | None, fmt: str) -> str:
    if key is None:
        return f"{row.get('prompt_len')}+{row.get('new_tokens')}"
    value = row.get(key)
    return "n/a" if value is None else fmt.format(value)


def _models(section: dict) -> list[str]:
    lines = [
        f"kernels {section.get('kernels')}, {section.get('dtype')}; MBU = (weights + KV read "
        "per decode step) / step time / measured copy GB/s; GPU busy = kernel time / wall time "
        "over profiled decode steps (torch.profiler).",
        "",
        "| " + " | ".join(title for title, _, _ in MODEL_COLUMNS) + " |",
        "|" + " --- |" * len(MODEL_COLUMNS),
    ]
    for row in section.get("rows", []):
        cells = [_cell(row, key, fmt) for _, key, fmt in MODEL_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    hf = {row.get("hf") for row in section.get("rows", [])} - {"ran"}
    lines += [f"- HF baseline: {note}" for note in sorted(hf)]
    lines += [f"- {note}" for note in section.get("notes", [])]
    return lines


def _sections(report: dict) -> list[str]:
    """The sections the report holds: the known ones in their order, then any other (a
    section scripts/gpu_check.py's TABLE_SECTIONS adds) in the order it ran."""
    known = [name for name in SECTIONS if name in report]
    others = [
        name for name, value in report.items()
        if name not in SECTIONS and isinstance(value, dict) and "status" in value
    ]  # fmt: skip
    return known + others


def _section(name: str, section: dict) -> list[str]:
    budget = f" of {section['budget_s']}s" if "budget_s" in section else ""
    lines = [
        f"## {name}",
        "",
        f"status: **{section.get('status')}** ({section.get('seconds')}s{budget})",
    ]
    if "command" in section:
        lines += ["", f"`{section['command']}`"]
    if name == "environment":
        lines += ["", f"device: {section.get('device')}, CUDA {section.get('torch_cuda')}"]
        lines += [f"- {k}: {v}" for k, v in section.get("packages", {}).items()]
        lines.append(f"- project packages absent (not needed here): {section.get('absent')}")
    elif name == "ceilings" and "copy_gbps" in section:
        gib, matmul = section["copy_bytes"] / 2**30, section["matmul_shape"]
        lines += [
            "",
            f"copy: {section['copy_gbps']:.1f} GB/s (read + write of {gib:.3g} GiB, CUDA events)",
            f"matmul {matmul}: {section['matmul_tflops']:.1f} TFLOP/s",
        ]
    elif name == "models":
        lines += ["", *_models(section)]
    elif name == "tests":
        tail = section.get("stdout", "").strip().splitlines()[-15:]
        lines += ["", "```", *tail, "```"] if tail else []
    elif "rows" in section:  # a kernel benchmark: its whole output, tables and all
        return lines + ["", section.get("stdout", "").strip(), ""]
    if not str(section.get("status")).startswith(("passed", "collected only (dry run): passed")):
        tail = section.get("stdout", "").strip()[-1500:]
        lines += ["", "output (tail):", "```", tail, "```"] if tail else []
    return lines + [""]


def render(report: dict) -> str:
    title = (
        "GPU check (DRY RUN: CPU, interpreter, tiny shapes)"
        if report.get("dry_run")
        else ("GPU check")
    )
    lines = [f"# {title}", ""]
    for name in _sections(report):
        lines += _section(name, report[name])
    if "total_seconds" in report:
        lines += [f"total: {report['total_seconds']}s", ""]
    lines += ["## Verdicts", "", *verdict_table(report.get("verdicts", []))]
    return "\n".join(lines) + "\n"
