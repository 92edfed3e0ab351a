"""The issue-2 benchmarks, each side by side with its baseline in the same run (see
docs/benchmarks.md). `layerserve bench` (benchmarks/cli.py) is the general one: all four
levels, named workloads, concurrency and Poisson sweeps, JSON/markdown/PNG.

python -m benchmarks.run l2          # engine in one process vs transformers generate()
python -m benchmarks.run l3          # L2, then the same workload through the gateway
python -m benchmarks.run plumbing    # null worker: tokens/s the hops carry to 128 clients
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.hf_baseline import hf_generate, hf_model
from benchmarks.machine import ceilings, machine
from benchmarks.offline import MODEL, make_engine
from benchmarks.service import run_through_gateway
from benchmarks.workload import Item, describe, uniform_workload
from services.scheduler.scheduler import SchedulerLimits
from services.stack import Stack, StackConfig
from services.worker.model.loader import default_path, load_model


def median_run(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - started)
        print(f"    run: {times[-1]:.2f}s", flush=True)
    return statistics.median(times), result


def l2(args, items: list[Item]) -> dict:
    loaded = load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))
    limits = SchedulerLimits(args.max_num_batched_tokens, args.max_num_seqs)
    engine = make_engine(loaded, args.num_blocks, limits)
    hf = hf_model(loaded, torch.float32)
    prompts = [i.prompt_ids for i in items]
    outs = [i.output_len for i in items]
    total_out = sum(outs)

    gate = items[:4]
    ours = engine.generate([g.prompt_ids for g in gate], [16] * len(gate))
    theirs = hf_generate(hf, [g.prompt_ids for g in gate], [16] * len(gate), batch_size=1)
    matches = sum(ours[f"r{i}"] == theirs[i] for i in range(len(gate)))
    print(f"  correctness gate: {matches}/{len(gate)} prompts identical for 16 greedy tokens")

    print("  layerserve engine (warm-up excluded):", flush=True)
    engine.generate(prompts[:2], [4, 4])
    ours_s, _ = median_run(lambda: engine.generate(prompts, outs), args.repeats)
    print("  transformers generate():", flush=True)
    hf_generate(hf, prompts[:2], [4, 4], batch_size=2)
    hf_s, _ = median_run(lambda: hf_generate(hf, prompts, outs, args.hf_batch_size), args.repeats)
    return {
        "gate_identical": f"{matches}/{len(gate)}",
        "engine_s": ours_s,
        "hf_s": hf_s,
        "engine_tok_s": total_out / ours_s,
        "hf_tok_s": total_out / hf_s,
        "speedup": hf_s / ours_s,
    }


def start_stack(args, null: bool, log_dir: Path) -> Stack:
    ports = range(args.port_base, args.port_base + 5)
    http, grpc_port, tok, sched, worker = ports
    stack = Stack(
        StackConfig(
            http_port=http,
            grpc_port=grpc_port,
            tokenizer_port=tok,
            scheduler_port=sched,
            worker_ports=(worker,),
            model_name=MODEL,
            null_worker=null,
            scheduler_args=[
                "--max-num-batched-tokens",
                str(args.max_num_batched_tokens),
                "--max-num-seqs",
                str(256 if null else args.max_num_seqs),
            ],
            # float32 as L2 and transformers run (the worker's default is the device's dtype).
            worker_args=[
                *("--num-blocks", str(args.num_blocks if not null else 65536)),
                *(() if null else ("--dtype", "float32")),
            ],
            log_dir=log_dir,
        )
    )
    stack.start()
    return stack


def l3(args, items: list[Item]) -> dict:
    with tempfile.TemporaryDirectory() as logs:
        stack = start_stack(args, null=False, log_dir=Path(logs))
        try:
            asyncio.run(run_through_gateway(stack.http_url, MODEL, items[:2]))  # warm-up
            results = []
            for _ in range(args.repeats):
                results.append(asyncio.run(run_through_gateway(stack.http_url, MODEL, items)))
                print(f"    run: {results[-1]['wall_s']:.2f}s", flush=True)
        finally:
            stack.stop()
    return sorted(results, key=lambda r: r["wall_s"])[len(results) // 2]


def plumbing(args) -> dict:
    items = [Item(list(range(1000, 1016)), args.plumbing_tokens) for _ in range(args.clients)]
    with tempfile.TemporaryDirectory() as logs:
        stack = start_stack(args, null=True, log_dir=Path(logs))
        try:
            asyncio.run(run_through_gateway(stack.http_url, MODEL, items[:4]))
            results = []
            for _ in range(args.repeats):
                results.append(asyncio.run(run_through_gateway(stack.http_url, MODEL, items)))
                print(f"    run: {results[-1]['output_tok_s']:.0f} tok/s", flush=True)
        finally:
            stack.stop()
    return sorted(results, key=lambda r: r["wall_s"])[len(results) // 2]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.run")
    p.add_argument("level", choices=["l2", "l3", "plumbing"])
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--input-range", type=int, nargs=2, default=(32, 512))
    p.add_argument("--output-range", type=int, nargs=2, default=(16, 256))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--hf-batch-size", type=int, default=64)
    p.add_argument("--clients", type=int, default=128)
    p.add_argument("--plumbing-tokens", type=int, default=500)
    p.add_argument("--port-base", type=int, default=38000)
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    report: dict = {"machine": machine(), "ceilings": ceilings(), "argv": sys.argv[1:]}
    print(json.dumps(report, indent=1), flush=True)
    items = uniform_workload(args.requests, tuple(args.input_range), tuple(args.output_range))
    report["workload"] = describe(items)
    print("workload:", report["workload"], flush=True)
    if args.level in ("l2", "l3"):
        print("L2:", flush=True)
        report["l2"] = l2(args, items)
        print(json.dumps(report["l2"], indent=1), flush=True)
    if args.level == "l3":
        print("L3:", flush=True)
        report["l3"] = l3(args, items)
        report["l3_over_l2"] = report["l3"]["output_tok_s"] / report["l2"]["engine_tok_s"]
        print(json.dumps({"l3": report["l3"], "l3_over_l2": report["l3_over_l2"]}, indent=1))
    if args.level == "plumbing":
        print("plumbing (null worker):", flush=True)
        report["plumbing"] = plumbing(args)
        print(json.dumps(report["plumbing"], indent=1), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
