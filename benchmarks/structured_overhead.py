"""What constrained decoding costs in a decode step (issue 19): the worker's ModelRunner on
SmolLM2, one static batch with every row constrained by a JSON schema (the set of
benchmarks/grammar_engines.py, cycled) vs the same batch unconstrained, greedy both, steps
interleaved so both see the same machine. Also the grammar compile time of each schema
(GrammarCache's compile, no cache), p50/p99 over the set.

    PYTHONPATH=. .venv/bin/python -m benchmarks.structured_overhead [--batch 16 64] [--steps 12]

The structured share of a constrained step (mask fill + unpack + consuming the tokens) is timed
inside it. A row whose grammar completes keeps going with an EOS-only mask, as a request that
ignores EOS would; the goal is an overhead of at most 10% of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from benchmarks.grammar_engines import percentile, schemas
from benchmarks.model_decode import _Batch
from benchmarks.offline import BLOCK_SIZE, make_runner
from benchmarks.sampling_cost import text_prompts
from services.common.sampling import SamplingOptions, StructuredOutput
from services.worker.engine.structured import StructuredDecoder


class TimedDecoder:
    """Wraps the runner's StructuredDecoder, timing masks() and advance() of each step."""

    def __init__(self, inner: StructuredDecoder) -> None:
        self.inner = inner
        self.seconds = 0.0

    def masks(self, *args, **kwargs):
        started = time.perf_counter()
        out = self.inner.masks(*args, **kwargs)
        self.seconds += time.perf_counter() - started
        return out

    def advance(self, *args, **kwargs):
        started = time.perf_counter()
        out = self.inner.advance(*args, **kwargs)
        self.seconds += time.perf_counter() - started
        return out

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def compile_times(decoder: StructuredDecoder, named: dict, repeats: int = 3) -> list[float]:
    decoder.cache.tokenizer()  # the vocabulary is built once per worker, not per schema
    seconds = []
    for schema in named.values():
        structured = StructuredOutput("json_schema", json.dumps(schema))
        for _ in range(repeats):
            started = time.perf_counter()
            decoder.cache._compile(structured)
            seconds.append(time.perf_counter() - started)
    return seconds


def measure(runner, batch: int, context: int, steps: int, named: dict) -> dict:
    blocks_each = -(-(context + steps + 2) // BLOCK_SIZE) + 1
    assert runner.num_blocks >= 2 * batch * blocks_each, "make the runner larger"
    prompts = text_prompts(batch, context)
    constraints = [StructuredOutput("json_schema", json.dumps(s)) for s in named.values()]
    options = [SamplingOptions(structured=constraints[i % len(constraints)]) for i in range(batch)]
    timed = runner._structured = TimedDecoder(runner._structured)
    free = _Batch(runner, prompts, f"free{batch}")
    constrained = _Batch(runner, prompts, f"json{batch}", options)
    times: dict[str, list[float]] = {"free": [], "json": [], "share": []}
    for _ in range(steps):
        for name, rows in (("free", free), ("json", constrained)):
            timed.seconds = 0.0
            started = time.perf_counter()
            rows.step()
            times[name].append(time.perf_counter() - started)
        times["share"].append(timed.seconds)  # the constrained step's
    free.finish()
    constrained.finish()
    runner._structured = timed.inner
    f, c, s = (1e3 * statistics.median(times[k]) for k in ("free", "json", "share"))
    return {"batch": batch, "free_ms": f, "json_ms": c, "structured_ms": s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from services.worker.model.loader import default_path, load_model

    loaded = load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))
    blocks_each = -(-(args.context + args.steps + 2) // BLOCK_SIZE) + 1
    runner = make_runner(loaded, 2 * max(args.batch) * blocks_each + 8)
    named = schemas()
    compiled = compile_times(runner._structured, named)
    rows = [measure(runner, b, args.context, args.steps, named) for b in args.batch]
    load = os.getloadavg()[0]
    print(
        f"{len(named)} schemas, context {args.context}, {args.threads} thread(s), load {load:.1f}"
    )
    print(
        f"compile p50 {1e3 * statistics.median(compiled):.2f} ms, "
        f"p99 {1e3 * percentile(compiled, 0.99):.2f} ms, max {1e3 * max(compiled):.2f} ms"
    )
    print("| batch | step unconstrained | step constrained | overhead | structured in step |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        overhead = r["json_ms"] / r["free_ms"] - 1
        print(
            f"| {r['batch']} | {r['free_ms']:.1f} ms | {r['json_ms']:.1f} ms | {overhead:+.1%} "
            f"| {r['structured_ms']:.2f} ms ({r['structured_ms'] / r['json_ms']:.1%}) |"
        )


if __name__ == "__main__":
    main()
