"""latency_throughput.png: L3 latency against throughput, one line per workload and sampling
mode (the concurrency sweep, each point labelled), Poisson rates as separate markers, and the
L2 offline throughputs of the same run as vertical lines for reference."""

from __future__ import annotations

from pathlib import Path


def plot_latency_throughput(report: dict, path: Path) -> bool:
    """Writes the PNG; False (and no file) when the report has no L3 rows to plot."""
    rows = report.get("l3", {}).get("rows", [])
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")  # no display: a file only
    import matplotlib.pyplot as plt

    fig, (ax_e2e, ax_tpot) = plt.subplots(1, 2, figsize=(12, 5))
    for key, ax, title in (
        (("e2e_ms"), ax_e2e, "end-to-end p50"),
        ("tpot_ms", ax_tpot, "TPOT p50"),
    ):
        _series(ax, rows, key)
        _l2_lines(ax, report)
        ax.set_xlabel("output tokens/s")
        ax.set_ylabel(f"{title} (ms)")
        ax.set_title(f"{title} vs throughput")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.15, y=0.1)  # room for the point labels
        ax.legend(fontsize=7)
    m = report["machine"]
    where = m["gpu"] or f"{m['cpus']} CPUs"
    fig.suptitle(
        f"layerserve bench, scale {report['scale']}, {where}, {report['model']} "
        f"{_l3_setting(rows)}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _l3_setting(rows: list[dict]) -> str:
    """What L3's worker computed in (older reports: float32)."""
    return rows[0].get("setting", "float32")


def _series(ax, rows: list[dict], key: str) -> None:
    groups: dict[tuple[str, str, bool], list[dict]] = {}
    for row in rows:
        key_ = (row["workload"], row.get("sampling", "greedy"), row["prefix_cache"])
        groups.setdefault(key_, []).append(row)
    for (workload, sampling, caching), group in groups.items():
        name = f"{workload}, {sampling}" + ("" if caching else " (cache off)")
        sweep = sorted(
            (r for r in group if r["mode"] == "concurrency"), key=lambda r: r["concurrency"]
        )
        color = None
        if sweep:
            xs = [r["output_tok_s"] for r in sweep]
            ys = [r[key]["p50"] for r in sweep]
            (line,) = ax.plot(xs, ys, marker="o", label=f"{name}: concurrency sweep")
            color = line.get_color()
            for x, y, r in zip(xs, ys, sweep, strict=True):
                ax.annotate(f"c={r['concurrency']}", (x, y), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")  # fmt: skip
        for r in (r for r in group if r["mode"] == "poisson"):
            ax.scatter(r["output_tok_s"], r[key]["p50"], marker="^", s=50, color=color)
            ax.annotate(f"Poisson {r['rate']:g} req/s", (r["output_tok_s"], r[key]["p50"]),
                        fontsize=7, xytext=(3, -9), textcoords="offset points")  # fmt: skip


L2_STYLES = {"layerserve": "--", "hf-static": ":", "hf-continuous": "-.", "llama-cpp": (0, (1, 3))}


def _l2_lines(ax, report: dict) -> None:
    for row in report.get("l2", {}).get("rows", []):
        if row["output_tok_s"] is None or row["system"] not in L2_STYLES:
            continue
        style = L2_STYLES[row["system"]]
        ax.axvline(row["output_tok_s"], linestyle=style, color="gray", linewidth=1,
                   label=f"L2 {row['system']} ({row['workload']}, "
                         f"{row.get('sampling', 'greedy')}, "
                         f"{row.get('precision', 'equal')})")  # fmt: skip
