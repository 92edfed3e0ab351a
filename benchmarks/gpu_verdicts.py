"""The GPU check's verdicts: one row per goal of issue 20, from the sections' measurements.

A goal whose section did not run reads "not run"; one whose section hit its time budget and
left no figure reads "FAIL: timeout"; in a dry run the figures are the CPU's and nothing is
judged ("dry run")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

DECODE_SHARE = 0.70  # of the copy bandwidth the check measured
PREFILL_RATIO = 0.90  # of torch's SDPA on the same shapes
BATCH1_TOK_S = 1000.0  # SmolLM2, batch 1
BATCH64_MBU = 0.40  # SmolLM2, batch 64: of the bandwidth bound (weights + KV per step)
GOAL_MODEL = "smollm2-135m"


@dataclass(frozen=True, slots=True)
class Goal:
    name: str
    target: str
    section: str
    # The measured figure (text) and whether it meets the target, or None: nothing measured.
    measure: Callable[[dict], tuple[str, bool] | None]


def _number(text: object) -> float | None:
    try:
        return float(str(text).rstrip("%"))
    except ValueError:
        return None


def _decode(report: dict) -> tuple[str, bool] | None:
    """The decode row moving the most KV bytes (batch x context x D): the bandwidth-bound one."""
    copy = report.get("ceilings", {}).get("copy_gbps")
    rows = [r for r in report.get("attention", {}).get("rows", []) if r.get("decode") == "decode"]
    rows = [r for r in rows if _number(r.get("kernel GB/s")) is not None]
    if not rows or not copy:
        return None
    size = lambda r: _number(r["batch"]) * _number(r["context"]) * _number(r["D"])  # noqa: E731
    row = max(rows, key=size)
    share = _number(row["kernel GB/s"]) / copy
    shape = f"batch {row['batch']} x {row['context']}, D={row['D']}"
    return f"{share:.0%} of {copy:.0f} GB/s ({shape})", share >= DECODE_SHARE


def _prefill(report: dict) -> tuple[str, bool] | None:
    """The worst ratio over the prefill rows."""
    rows = [r for r in report.get("attention", {}).get("rows", []) if r.get("prefill") == "prefill"]
    ratios = []
    for r in rows:
        ours, sdpa = _number(r.get("kernel TFLOP/s")), _number(r.get("SDPA TFLOP/s"))
        if ours is not None and sdpa:
            ratios.append((ours / sdpa, f"seq {r['seq len']}, D={r['D']}"))
    if not ratios:
        return None
    worst, shape = min(ratios)
    return f"{worst:.2f}x at worst ({shape}; {len(ratios)} shapes)", worst >= PREFILL_RATIO


def _model_rows(report: dict, batch: int) -> list[dict]:
    rows = report.get("models", {}).get("rows", [])
    named = [r for r in rows if r.get("model") == GOAL_MODEL] or rows  # a dry run's tiny model
    model = named[0]["model"] if named else None
    return [r for r in named if r.get("model") == model and r.get("batch") == batch]


def _batch1(report: dict) -> tuple[str, bool] | None:
    rows = _model_rows(report, 1)
    if not rows:
        return None
    best = max(rows, key=lambda r: r["ours_decode_tok_s"])
    rate = best["ours_decode_tok_s"]
    return f"{rate:,.0f} tok/s ({best['mode']})", rate >= BATCH1_TOK_S


def _batch64(report: dict) -> tuple[str, bool] | None:
    rows = _model_rows(report, 64) or _model_rows(report, 2)  # the dry run's largest is 2
    if not rows:
        return None
    best = max(rows, key=lambda r: r["mbu"])
    return (
        f"{best['mbu']:.0%} ({best['mode']}, batch {best['batch']}, "
        f"{best['ours_decode_tok_s']:,.0f} tok/s)",
        best["mbu"] >= BATCH64_MBU,
    )


def _greedy(report: dict) -> tuple[str, bool] | None:
    rows = report.get("models", {}).get("rows", [])
    compared = [r for r in rows if r.get("greedy_same_as_hf")]
    if not compared:
        return None
    same = total = 0
    for row in compared:
        a, b = row["greedy_same_as_hf"].split("/")
        same, total = same + int(a), total + int(b)
    return f"{same}/{total} sequences identical ({len(compared)} rows)", same == total


GOALS = (
    Goal("decode attention", f">= {DECODE_SHARE:.0%} of measured bandwidth", "attention", _decode),
    Goal("prefill attention", f">= {PREFILL_RATIO}x SDPA", "attention", _prefill),
    Goal("SmolLM2 batch 1", f">= {BATCH1_TOK_S:,.0f} tok/s", "models", _batch1),
    Goal("SmolLM2 batch 64", f">= {BATCH64_MBU:.0%} of the bandwidth bound", "models", _batch64),
    Goal("greedy output", "equal to transformers", "models", _greedy),
)


def verdicts(report: dict) -> list[dict]:
    """One row per goal: goal, target, measured, verdict (PASS, FAIL, FAIL: timeout, not run,
    dry run)."""
    rows = []
    for goal in GOALS:
        section = report.get(goal.section)
        status = str((section or {}).get("status", ""))
        measured = goal.measure(report) if section else None
        if measured is None:
            timed_out = status.startswith("FAIL: timeout")
            text, verdict = "-", "FAIL: timeout" if timed_out else "not run"
            if section and not timed_out and status not in ("passed", "ok"):
                verdict = "FAIL"
                text = f"nothing measured ({status})"
        else:
            text, ok = measured
            verdict = "dry run" if report.get("dry_run") else ("PASS" if ok else "FAIL")
        rows.append({"goal": goal.name, "target": goal.target, "measured": text,
                     "verdict": verdict})  # fmt: skip
    return rows


def verdict_table(rows: list[dict]) -> list[str]:
    lines = ["| goal | target | measured | verdict |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['goal']} | {r['target']} | {r['measured']} | {r['verdict']} |" for r in rows]
    return lines
