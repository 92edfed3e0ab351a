"""Prefix caching in the one-process engine (L2), each side by side with its baseline:

python -m benchmarks.prefix                 # both parts below
python -m benchmarks.prefix --skip-l2       # only the shared-prefix time to first token

1. Its cost when nothing is shared: the L2 workload (random prompts: 0% hits) with caching on
   and off, runs alternated, median of --repeats.
2. Its gain when something is: time to first token of a request whose --prefix-len tokens
   were cached by an earlier request (warm) vs the same request on an empty cache (cold).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.offline import OfflineEngine, make_runner, to_plan
from benchmarks.workload import describe, uniform_workload
from services.common.sampling import SamplingOptions
from services.scheduler.request import Request
from services.scheduler.scheduler import Sample, SchedulerLimits
from services.worker.model.loader import LoadedModel, default_path, load_model


def make_engine(loaded: LoadedModel, args, caching: bool) -> OfflineEngine:
    runner = make_runner(loaded, args.num_blocks)
    limits = SchedulerLimits(
        args.max_num_batched_tokens, args.max_num_seqs, enable_prefix_caching=caching
    )
    return OfflineEngine(runner, limits)


def no_hits(args, engines: dict[bool, OfflineEngine]) -> dict:
    """Wall time of the L2 workload, caching off vs on; the cache is emptied before each run
    so that repeats do not hit the prompts of the previous one."""
    items = uniform_workload(args.requests, (32, 512), (16, 256))
    print("workload:", describe(items), flush=True)
    prompts, outs = [i.prompt_ids for i in items], [i.output_len for i in items]
    for engine in engines.values():  # warm-up
        engine.generate(prompts[:2], [4, 4])
    times: dict[bool, list[float]] = {False: [], True: []}
    hits = 0
    for repeat in range(args.repeats):
        for caching in (False, True) if repeat % 2 == 0 else (True, False):
            engine = engines[caching]
            engine.scheduler.kv.drop_cache()
            before = engine.scheduler.stats.num_prefix_hit_tokens
            started = time.perf_counter()
            engine.generate(prompts, outs)
            times[caching].append(time.perf_counter() - started)
            hits += engine.scheduler.stats.num_prefix_hit_tokens - before
            print(
                f"    caching {'on ' if caching else 'off'}: {times[caching][-1]:.2f}s", flush=True
            )
    off, on = statistics.median(times[False]), statistics.median(times[True])
    return {
        "workload": describe(items),
        "off_s": off,
        "on_s": on,
        "on_over_off": on / off,
        "hit_tokens": hits,
        "output_tok_s_off": sum(outs) / off,
        "output_tok_s_on": sum(outs) / on,
    }


def time_to_first_token(engine: OfflineEngine, request_id: str, prompt: list[int]) -> tuple:
    """Seconds from submit to the first sampled token, and the prompt tokens served from cache."""
    sched = engine.scheduler
    request = Request(request_id, prompt, 1, SamplingOptions(), frozenset())
    started = time.perf_counter()
    sched.add(request)
    while not request.output_token_ids:
        sampled = engine.runner.execute(to_plan(sched.schedule()))
        sched.update([Sample(s.request_id, s.token_id) for s in sampled])
    return time.perf_counter() - started, request.num_cached_tokens


def shared_prefix(args, engine: OfflineEngine) -> dict:
    rng = random.Random(1)
    prefix = [rng.randint(1000, 40000) for _ in range(args.prefix_len)]
    cold, warm, cached = [], [], 0
    time_to_first_token(engine, "warm-up", prefix[:64])
    for repeat in range(args.repeats):
        engine.scheduler.kv.drop_cache()
        suffixes = [[rng.randint(1000, 40000) for _ in range(args.suffix_len)] for _ in range(2)]
        seconds, _ = time_to_first_token(engine, f"cold{repeat}", prefix + suffixes[0])
        cold.append(seconds)
        seconds, cached = time_to_first_token(engine, f"warm{repeat}", prefix + suffixes[1])
        warm.append(seconds)
        print(f"    cold {cold[-1] * 1e3:.1f} ms, warm {warm[-1] * 1e3:.1f} ms", flush=True)
    return {
        "prompt_tokens": args.prefix_len + args.suffix_len,
        "cached_tokens": cached,
        "cold_ms": statistics.median(cold) * 1e3,
        "warm_ms": statistics.median(warm) * 1e3,
        "speedup": statistics.median(cold) / statistics.median(warm),
    }


def table(report: dict) -> str:
    rows = ["| measurement | baseline | prefix caching | ratio |", "| --- | --- | --- | --- |"]
    if "no_hits" in report:
        r = report["no_hits"]
        rows.append(
            f"| L2 wall, 0% hits ({r['workload']}; {r['hit_tokens']} hit tokens) | "
            f"off {r['off_s']:.2f} s | on {r['on_s']:.2f} s | on/off {r['on_over_off']:.3f} |"
        )
    r = report["shared_prefix"]
    rows.append(
        f"| time to first token, {r['prompt_tokens']}-token prompt "
        f"({r['cached_tokens']} cached when warm) | cold {r['cold_ms']:.1f} ms | "
        f"warm {r['warm_ms']:.1f} ms | {r['speedup']:.1f}x faster |"
    )
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prefix")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--prefix-len", type=int, default=1024)
    p.add_argument("--suffix-len", type=int, default=16)
    p.add_argument("--skip-l2", action="store_true", help="only the shared-prefix part")
    p.add_argument("--json", type=Path, help="also write the results here")
    args = p.parse_args()
    loaded = load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))
    report: dict = {
        "argv": vars(args) | {"json": str(args.json)},
        "threads": torch.get_num_threads(),
    }
    on = make_engine(loaded, args, caching=True)
    if not args.skip_l2:
        print("L2, 0% prefix hits:", flush=True)
        report["no_hits"] = no_hits(args, {False: make_engine(loaded, args, False), True: on})
    print("shared prefix, time to first token:", flush=True)
    report["shared_prefix"] = shared_prefix(args, on)
    print(json.dumps(report, indent=1))
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
