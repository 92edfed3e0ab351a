"""The outputs of `layerserve bench` on a hand-made report: JSON, markdown, the docs section
that --update-docs rewrites, and the command-line options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cli import docs_refusal, parse_config
from benchmarks.docs_section import BEGIN, END, replace_section, update_docs
from benchmarks.report import render_markdown, write_json, write_markdown


def stats(mean: float, p50: float, p99: float) -> dict:
    return {"mean": mean, "p50": p50, "p99": p99}


def l3_row(mode: str, concurrency: int | None, rate: float | None, tok_s: float) -> dict:
    return {
        "workload": "mixed", "sampling": "sampled", "prefix_cache": True, "mode": mode,
        "concurrency": concurrency, "rate": rate, "requests_s": 0.5, "output_tok_s": tok_s,
        "l3_over_l2": 0.9,
        "slo_attained": 0.75, "goodput_requests_s": 0.375, "ttft_ms": stats(120, 110, 300),
        "tpot_ms": stats(40, 38, 90), "itl_ms": stats(41, 37, 95), "e2e_ms": stats(900, 850, 2000),
    }  # fmt: skip


def report() -> dict:
    return {
        "command": "layerserve bench --level l1,l2,l3", "scale": "small", "seed": 0,
        "model": "smollm2-135m-instruct", "dtype": "float32", "repeats": 3,
        "precisions": {
            "default": {"layerserve": "bfloat16", "llama_cpp": "as shipped",
                        "reason": "auto: the CPU has AVX512-BF16 or AMX"},
            "equal": {"layerserve": "float32", "llama_cpp": "F32", "reason": "equal precision"},
        },
        "samplings": {"sampled": "temperature 0.7, top_p 0.95, a seed per request"},
        "busy": None,
        "started_at": "2026-11-30 09:00 UTC", "finished_at": "2026-11-30 09:05 UTC",
        "slo": {"ttft_ms": 3000.0, "tpot_ms": 300.0},
        "machine": {
            "python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.24.0",
            "triton": "3.7.1", "layerserve_commit": "abc1234", "torch_threads": 2, "cpus": 2,
            "machine": "x86_64", "cpu_model": "AMD EPYC", "gpu": None,
            "load_average": [1.5, 1.2, 0.9],
        },
        "load_average_after": [2.0, 1.4, 1.0],
        "ceilings": {"copy_GB_s": 57.0, "matmul_GFLOP_s": 181.0},
        "l1": {"decode_steps": 8, "rows": [{
            "batch": 8, "context": 128, "prefill_ms": 812.0, "decode_step_ms": 61.0,
            "decode_tok_s": 131.1, "step_GB": 0.62, "mbu": 0.18, "busy_share": None}]},
        "l2": {
            "gate": {"prompts": 4, "tokens": 16, "engine": "4/4", "passed": True,
                     "llama-cpp": "3/4"},
            "workloads": {"mixed": "12 requests, 1700 prompt tokens, 330 output tokens"},
            "rows": [
                {"workload": "mixed", "sampling": "sampled", "system": "layerserve",
                 "precision": "default", "setting": "bfloat16", "wall_s": 6.0,
                 "runs_s": [6.0, 6.2], "output_tok_s": 55.0, "vs_hf_static": 1.83,
                 "vs_llama_cpp": 0.5, "note": ""},
                {"workload": "mixed", "sampling": "sampled", "system": "hf-static",
                 "wall_s": 11.0, "runs_s": [11.0], "output_tok_s": 30.0, "vs_hf_static": 1.0,
                 "vs_llama_cpp": 0.27, "note": "one seed per batch"},
                {"workload": "mixed", "sampling": "sampled", "system": "llama-cpp",
                 "precision": "default", "setting": "Q4_1 (as shipped)", "wall_s": 3.0,
                 "runs_s": [3.0], "output_tok_s": 110.0, "vs_hf_static": 3.67,
                 "vs_llama_cpp": 1.0, "note": "llama 135M Q4_1"},
                {"workload": "mixed", "sampling": "sampled", "system": "hf-continuous",
                 "wall_s": None, "output_tok_s": None,
                 "note": "not in this transformers version: not run"},
                {"workload": "mixed", "sampling": "sampled", "system": "llama-cpp",
                 "precision": "equal", "setting": "F32", "wall_s": None, "output_tok_s": None,
                 "crashed": True, "note": "crashed: killed by SIGSEGV (rc 139)"},
            ],
        },
        "l3": {"rows": [l3_row("concurrency", 1, None, 20.0), l3_row("poisson", None, 2.0, 40.0)]},
    }  # fmt: skip


def test_markdown_has_the_machine_the_levels_and_the_numbers(tmp_path: Path) -> None:
    path = tmp_path / "results.md"
    write_markdown(report(), path)
    text = path.read_text()
    assert "`layerserve bench --level l1,l2,l3`" in text
    assert "torch 2.13.0+cpu" in text and "transformers 5.24.0" in text
    assert "1.50 / 1.20 / 0.90" in text and "2.00 / 1.40 / 1.00" in text  # load averages
    assert "| 8 | 128 | 812 | 61 | 131 | 0.62 | 18% | n/a |" in text
    assert "4/4 prompts give identical 16 greedy tokens" in text
    assert "llama-cpp agrees on 3/4 prompts that repeat a pattern" in text and "not gated" in text
    assert "`sampled`: temperature 0.7, top_p 0.95, a seed per request" in text
    assert "`default`: layerserve bfloat16 (auto: the CPU has AVX512-BF16 or AMX)" in text
    assert "`equal`: layerserve float32 (equal precision), llama.cpp F32" in text
    assert (
        "| mixed | sampled | default | layerserve | bfloat16 | 6 | 6.0, 6.2 | 55 | 1.83x | 0.50x "
        "|  |" in text
    )
    assert (
        "| mixed | sampled | default | llama-cpp | Q4_1 (as shipped) | 3 | 3.0 | 110 | 3.67x | "
        "1.00x | llama 135M Q4_1 |" in text
    )
    assert (
        "| mixed | sampled | equal | hf-continuous | float32 | n/a | n/a | n/a | n/a | n/a | not "
        "in this" in text
    )  # a row from before the pairings: transformers ran float32
    assert (
        "| mixed | sampled | equal | llama-cpp | F32 | n/a | n/a | n/a | n/a | n/a | **CRASHED** "
        "crashed: killed by SIGSEGV (rc 139) |" in text
    )
    assert "| mixed | sampled | on | concurrency 1 | 0.5 | 20 | 0.9 | 75% | 0.375 |" in text
    assert "| mixed | sampled | on | Poisson 2 req/s |" in text
    assert "busy machine" not in text
    assert "120 / 110 / 300" in text and "900 / 850 / 2,000" in text
    assert "TTFT <= 3000 ms and TPOT <= 300 ms" in text
    assert "L0" not in text  # not run, not shown


def test_a_busy_run_is_marked_at_the_top() -> None:
    r = report() | {"busy": "the 1-minute load average was 3.00 at the start, above 1"}
    assert render_markdown(r).startswith("> **Measured on a busy machine**: the 1-minute load")
    text = render_markdown(r | {"allow_busy": True})
    assert text.startswith("> **Measured on a busy machine** (recorded with `--allow-busy`): ")


def test_a_failed_gate_is_stated() -> None:
    r = report()
    r["l2"]["gate"] |= {"engine": "3/4", "passed": False}
    assert "3/4 prompts give identical 16 greedy tokens" in render_markdown(r)
    assert "FAILED, no L2 numbers" in render_markdown(r)


def test_an_l0_dry_run_says_so() -> None:
    script = {"module": "benchmarks.kernels.attention", "exit_code": 0, "output": "| decode |"}
    r = report() | {"l0": {"dry_run": True, "scripts": [script]}}
    text = render_markdown(r)
    assert "DRY RUN (no GPU)" in text and "measure the interpreter" in text


def test_json_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    write_json(report(), path)
    assert json.loads(path.read_text()) == report()


def test_docs_section_is_replaced_and_the_rest_kept(tmp_path: Path) -> None:
    before = "# Benchmarks\n\nhand-written text\n\n"
    after = "\n\n## Later section\n\nmore text, kept as it is\n"
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"{before}{BEGIN}\nold numbers\n{END}{after}")
    update_docs(doc, "new numbers")
    text = doc.read_text()
    assert text == f"{before}{BEGIN}\nnew numbers\n{END}{after}"
    update_docs(doc, "newer numbers")
    assert doc.read_text() == f"{before}{BEGIN}\nnewer numbers\n{END}{after}"


def test_docs_without_markers_get_the_section_appended() -> None:
    text = replace_section("# Benchmarks\n\nkept\n", "numbers")
    assert text == f"# Benchmarks\n\nkept\n\n{BEGIN}\nnumbers\n{END}\n"


def test_docs_with_broken_markers_are_refused() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        replace_section(f"{END}\n{BEGIN}\n", "numbers")
    with pytest.raises(ValueError, match="exactly one"):
        replace_section(f"{BEGIN}\n{END}\n{BEGIN}\n{END}\n", "numbers")


def test_plot_is_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib comes with the bench extra")
    from benchmarks.plot import plot_latency_throughput

    path = tmp_path / "plot.png"
    assert plot_latency_throughput(report(), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not plot_latency_throughput({"machine": {}}, tmp_path / "none.png")


def test_options_default_to_the_scale_and_parse_lists(tmp_path: Path) -> None:
    config = parse_config(["--scale", "tiny", "--out", str(tmp_path)])
    assert config.levels == ("l1", "l2", "l3") and config.workloads == ("mixed",)
    assert config.concurrency == (1, 4) and config.rates == (2.0,) and config.repeats == 1
    assert config.docs is None and not config.allow_busy
    assert [s.name for s in config.samplings] == ["sampled", "greedy"]
    assert config.baselines == ("hf-static", "hf-continuous", "llama-cpp")
    sampled = config.samplings[0]
    assert (sampled.temperature, sampled.top_p) == (0.7, 0.95)
    config = parse_config(
        ["--level", "l0,l3", "--workload", "fixed,shared-prefix", "--concurrency", "1,8,32",
         "--rates", "0.5,2", "--baselines", "none", "--update-docs", "--slo-ttft-ms", "500"]
    )  # fmt: skip
    assert config.levels == ("l0", "l3") and config.workloads == ("fixed", "shared-prefix")
    assert config.concurrency == (1, 8, 32) and config.rates == (0.5, 2.0)
    assert config.baselines == () and config.docs == Path("docs/benchmarks.md")
    assert config.slo.ttft_s == pytest.approx(0.5)
    config = parse_config(["--sampling", "greedy", "--workload", "long-context", "--allow-busy"])
    assert [s.name for s in config.samplings] == ["greedy"] and config.allow_busy
    assert config.workloads == ("long-context",)


def test_each_side_runs_at_its_default_and_at_equal_precision(monkeypatch) -> None:
    monkeypatch.delenv("LAYERSERVE_WORKER_DTYPE", raising=False)
    monkeypatch.delenv("LAYERSERVE_WORKER_QUANTIZATION", raising=False)
    import torch

    from services.worker.config import WorkerConfig
    from services.worker.dtype_choice import resolve_dtype
    from services.worker.model.loader import default_path
    from services.worker.model.quant_choice import keeps_four_bit, resolve_quantization

    default, equal = parse_config([]).precisions
    # default: what `layerserve` runs with no flag on this machine, llama.cpp's file untouched
    worker_quantization = WorkerConfig.from_args([]).quantization
    four_bit = keeps_four_bit(worker_quantization, default_path(), "cpu")
    auto = resolve_dtype("auto", torch.device("cpu"), four_bit_weights=four_bit)
    assert default.dtype == auto.dtype
    weights = resolve_quantization(worker_quantization, default_path(), "cpu", default.dtype)
    assert default.quantization == weights.method and weights.reason in default.reason
    assert default.llama_cpp("Q4_1") == "Q4_1 (as shipped)"
    assert (equal.layerserve(), equal.llama_cpp_type) == ("float32", "F32")
    assert equal.worker_args() == ["--dtype", "float32", "--quantization", "none"]
    (pinned,) = parse_config(
        ["--precision", "default", "--dtype", "bfloat16", "--quantization", "int8",
         "--llama-cpp-type", "Q8_0"]
    ).precisions  # fmt: skip
    assert pinned.layerserve() == "bfloat16 + int8 weights"
    assert pinned.reason == "--dtype; --quantization"
    assert pinned.llama_cpp("Q4_1") == "Q8_0 (converted from the Q4_1 file by llama.cpp)"
    # equal-q4: llama.cpp's own formats on both sides, the 4-bit file and 8-bit activations
    (same_file,) = parse_config(["--precision", "equal-q4"]).precisions
    assert same_file.llama_cpp("Q4_1") == "Q4_1 (as shipped)"
    assert same_file.layerserve() == "float32 + gguf weights, int8 activations"
    assert same_file.worker_args() == [
        "--dtype", "float32", "--quantization", "gguf", "--activations", "int8"
    ]  # fmt: skip


def test_equal_q4_loads_the_4_bit_weights_with_int8_activations() -> None:
    from benchmarks.precision import load_layerserve
    from services.worker.layers import int8_activations
    from services.worker.layers.int4_weight import Int4Weight

    if not int8_activations.op_available("int8act"):
        pytest.skip("the CPU extension's integer ops are not built")
    (same_file,) = parse_config(["--precision", "equal-q4"]).precisions
    loaded = load_layerserve(same_file)
    kernels = {b.kernel.name for b in loaded.model.buffers() if isinstance(b, Int4Weight)}
    assert kernels == {"int8act"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--level", "l4"], "--level: l4 not in"),
        (["--workload", "mixed,chat"], "--workload: chat not in"),
        (["--baselines", "vllm"], "--baselines: vllm not in"),
        (["--concurrency", "0"], ">= 1"),
        (["--rates", "fast"], "not a list of numbers"),
        (["--repeats", "0"], "positive"),
        (["--scale", "huge"], "unknown scale"),
        (["--sampling", "beam"], "--sampling: beam not in"),
        (["--precision", "half"], "--precision: 'half' is not a list of"),
        (["--quantization", "int9"], "--quantization: 'int9' is not one of"),
    ],
)
def test_bad_options_are_refused_with_the_flag_named(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_config(argv)


def test_update_docs_is_refused_on_a_busy_machine_unless_allowed() -> None:
    docs = parse_config(["--update-docs"])
    assert docs_refusal(docs, load_1min=0.9, cpus=2) is None  # 0.9 <= 0.5 x 2
    refusal = docs_refusal(docs, load_1min=3.41, cpus=2)
    assert refusal and "3.41" in refusal and "above 1 (0.5 x 2 cores)" in refusal
    assert "--allow-busy" in refusal
    assert docs_refusal(parse_config(["--update-docs", "--allow-busy"]), 3.41, 2) is None
    assert docs_refusal(parse_config([]), 3.41, 2) is None  # no docs, nothing to protect


def test_main_exits_before_measuring_when_the_docs_would_get_a_busy_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    import benchmarks.cli as cli

    monkeypatch.setattr(cli, "load_average", lambda: [64.0, 10.0, 5.0])
    monkeypatch.setattr(cli, "run", lambda *a: pytest.fail("measured on a busy machine"))
    assert cli.main(["--update-docs", "--docs", str(tmp_path / "b.md")]) == 3
    assert "refusing --update-docs: the 1-minute load average was 64.00" in capsys.readouterr().err
    assert not (tmp_path / "b.md").exists()
