"""`layerserve bench` end to end on the real model, as small as it goes: L2 on four requests
of a few tokens, sampled and greedy, layerserve and llama.cpp at each side's default and at
equal precision, the correctness gate against transformers first, results.json after.
llama.cpp runs where the `llama-cpp` extra is installed and says it is not installed where it
is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the L2 baseline comes with the bench extra")

PAIRED = ("layerserve", "llama-cpp")  # once per precision pairing; hf-static once, float32


def test_bench_l2_tiny_writes_the_results(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "services.launcher", "bench", "--level", "l2",
               "--scale", "tiny", "--baselines", "hf-static,llama-cpp", "--threads", "1",
               "--out", str(tmp_path)]  # fmt: skip
    # Two pairings, each baseline a child process (llama.cpp converting its F32 file): minutes
    # on a busy 2-core box.
    done = subprocess.run(command, capture_output=True, text=True, timeout=480)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["command"].startswith("layerserve bench --level l2 --scale tiny")
    assert report["machine"]["torch_threads"] == 1 and report["machine"]["load_average"]
    assert report["ceilings"]["copy_GB_s"] > 0
    gate = report["l2"]["gate"]
    assert {k: v for k, v in gate.items() if k != "llama-cpp"} == {
        "prompts": 2, "tokens": 4, "engine": "2/2", "passed": True
    }  # fmt: skip
    rows = {(row["sampling"], row["precision"], row["system"]): row for row in report["l2"]["rows"]}
    samplings = ("sampled", "greedy")
    assert set(rows) == {
        (s, p, b) for s in samplings for p in ("default", "equal") for b in PAIRED
    } | {(s, "equal", "hf-static") for s in samplings}
    assert rows["greedy", "equal", "layerserve"]["setting"] == "float32"
    assert rows["greedy", "equal", "llama-cpp"]["setting"].startswith("F32 (converted from")
    assert rows["greedy", "default", "llama-cpp"]["setting"] == "Q4_1 (as shipped)"
    assert set(report["precisions"]) == {"default", "equal"}
    for (_, _, system), row in rows.items():
        assert row["workload"] == "mixed"
        if system == "llama-cpp" and row["wall_s"] is None:
            assert row["note"] == "not installed: pip install -e '.[llama-cpp]'"
            continue
        assert row["output_tokens"] > 0
        assert row["output_tok_s"] == pytest.approx(row["output_tokens"] / row["wall_s"])
    assert rows["sampled", "equal", "hf-static"]["vs_hf_static"] == 1.0
    assert "l3" not in report and "l1" not in report
    text = (tmp_path / "results.md").read_text()
    assert "| mixed | sampled | default | layerserve |" in text
    assert "| mixed | greedy | equal | layerserve | float32 |" in text
    assert "%|" in done.stderr  # the progress bar
