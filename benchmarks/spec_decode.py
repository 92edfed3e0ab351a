"""Speculative decoding with n-gram lookup (issue 21): output tokens/s with speculation off, on
with a fixed number of proposals, and on with the adaptive policy (spec_policy.py), side by
side in one run, on the real SmolLM2 through the engine (L2: scheduler + model runner in one
process, benchmarks/offline.py), at the worker's own --dtype and --quantization (auto: what
it picks for the file on this device, e.g. float32 with the GGUF's 4-bit weights kept on a CPU).

Workloads (PERFORMANCE.md (f) and a control), 16 chat requests each:
- grounded: rewrite a passage of benchmarks/data/public_domain.txt, edit a code snippet, answer
  a question quoting a passage: the output repeats the input, the n-gram proposer's case;
- open: prompts whose answers do not repeat them (stories, lists, explanations).

Each at concurrency 1 (8 of the requests, one after another) and 8 (each of the 16 twice, 32
requests through 8 slots, continuous batching), greedy and sampled rows (temperature 0.7,
top_p 0.95, a seed per request); requests end at EOS or --max-tokens. Modes run interleaved,
each repeated; the median counts. At concurrency 1 a second table gives the decode alone:
speculation cannot shorten a prompt's prefill, so each run's time less the same prompts run to
their first token (speculation off, once per repeat) over the tokens after the first. Also
reported: acceptance rate (accepted / proposed tokens) and mean accepted length (tokens a
request got per step that carried proposals), and whether greedy tokens equal those without
speculation.

Greedy is the correctness gate, and it is run in float32 (--gate): in bfloat16 the rows of a
step round differently with 1 + k queries than with 1, so a near-tie may flip and a greedy
output part ways, as it does between batch sizes.

    python -m benchmarks.spec_decode                      # k 8, n-grams 3..6, 3 repeats
    python -m benchmarks.spec_decode --repeats 1 --max-tokens 48 --batches 8
    python -m benchmarks.spec_decode --device cuda --repeats 1 --max-tokens 16 --prompts 8
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from benchmarks.machine import load_average, machine
from benchmarks.offline import OfflineEngine, make_runner
from services.common.sampling import SamplingOptions
from services.scheduler.request import Request
from services.scheduler.scheduler import SchedulerLimits
from services.scheduler.spec_decode import NgramProposer

TEXT = Path(__file__).parent / "data" / "public_domain.txt"
CODE = [
    "def mean(values):\n    total = 0\n    for v in values:\n        total = total + v\n"
    "    return total / len(values)\n",
    "def read_config(path):\n    f = open(path)\n    lines = f.readlines()\n    f.close()\n"
    "    config = {}\n    for line in lines:\n        key, value = line.split('=')\n"
    "        config[key] = value\n    return config\n",
    "class Counter:\n    def __init__(self):\n        self.counts = {}\n\n"
    "    def add(self, word):\n        if word in self.counts:\n"
    "            self.counts[word] += 1\n"
    "        else:\n            self.counts[word] = 1\n",
    "def fizzbuzz(n):\n    out = []\n    for i in range(1, n + 1):\n        if i % 15 == 0:\n"
    "            out.append('FizzBuzz')\n        elif i % 3 == 0:\n            out.append('Fizz')\n"
    "        elif i % 5 == 0:\n            out.append('Buzz')\n        else:\n"
    "            out.append(str(i))\n    return out\n",
]
QUESTIONS = [
    "What does the passage say about the people it speaks of?",
    "What is the main point of the passage?",
    "What does the speaker ask of the listeners?",
]
OPEN = [
    "Write a short story about a lighthouse keeper who finds a strange map.",
    "List ten creative names for a coffee shop and explain each one.",
    "Explain how a rainbow forms, as if to a curious child.",
    "Describe your ideal weekend in the mountains.",
    "Give five tips for learning a new language quickly.",
    "Invent a new board game and describe its rules.",
    "Write a letter from a cat to its owner about breakfast.",
    "What would a city on Mars look like in the year 2200?",
    "Write a poem about the first snow of winter.",
    "Why do people enjoy listening to music? Give a few reasons.",
    "Plan a three-day trip to a city you have never visited.",
    "Describe a day in the life of a honeybee.",
    "What are the pros and cons of working from home?",
    "Tell a funny story about a robot learning to cook.",
    "Suggest a healthy breakfast menu for a busy week.",
    "Imagine a world without electricity and describe it.",
]
MODES = ("off", "fixed", "adaptive")
LONG_TASKS = [
    "Rewrite the text above in plain modern English, keeping it close to the original.",
    "Quote the sentence of the text above that speaks of the dead, then explain it.",
    "Copy the first paragraph of the text above, then summarise the rest.",
    "List the people and places the text above names, quoting where each appears.",
    "Quote the last sentence of the text above and explain what it asks.",
    "Find every sentence of the text above that speaks of liberty and quote it.",
    "Rewrite the second half of the text above as a short speech for today.",
    "Answer, quoting the text above: what does the speaker want the listeners to do?",
]


def grounded_prompts() -> list[str]:
    passages = [p for p in TEXT.read_text().split("\n\n") if len(p) > 300]
    rewrite = [
        f"Rewrite the following passage in plain modern English, keeping it close to the "
        f"original:\n\n{passage}"
        for passage in passages[:4]
    ]
    hints = [
        f"Add type hints and a docstring to this Python code, and return the whole code:\n\n"
        f"```python\n{code}```"
        for code in CODE
    ]
    comments = [
        f"Add a short comment above each line of this Python code, and return the whole "
        f"code:\n\n```python\n{code}```"
        for code in CODE
    ]
    quotes = [
        f"Read the passage and answer the question, quoting the sentences that support your "
        f"answer.\n\nPassage:\n{passage}\n\nQuestion: {question}"
        for passage, question in zip(passages[1:], QUESTIONS, strict=False)
    ]
    prompts = [
        *rewrite,
        *hints,
        *comments,
        *quotes,
        f"Summarise this passage in two sentences, using its own words:\n\n{passages[-1]}",
    ]
    return prompts[:16]


def long_prompts() -> list[str]:
    """The whole of public_domain.txt (~900 tokens) with a task that quotes or rewrites it."""
    text = TEXT.read_text()
    return [f"{text}\n\n{task}" for task in LONG_TASKS] * 2


@dataclass(slots=True)
class Run:
    seconds: float
    tokens: dict[str, list[int]]
    draft_tokens: int = 0
    accepted_tokens: int = 0
    spec_steps: int = 0

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens.values())


def make_engines(loaded, args) -> dict[str, OfflineEngine]:
    """One engine per mode, kept for the whole run as a server keeps its scheduler: the
    adaptive policy's step costs and acceptance carry from run to run. Prefix caching is off,
    so that a repeat computes its prompts again."""
    engines = {}
    for mode in MODES:
        proposer = None if mode == "off" else NgramProposer(args.ngram_min, args.ngram_max, args.k)
        runner = make_runner(loaded, num_blocks=2048)
        limits = SchedulerLimits(max_num_batched_tokens=1024, enable_prefix_caching=False)
        engines[mode] = OfflineEngine(
            runner, limits, proposer=proposer, adaptive_speculation=mode == "adaptive"
        )
    return engines


def run_once(
    engine: OfflineEngine, prompts: list[list[int]], options: SamplingOptions, batch: int, args
) -> Run:
    scheduler = engine.scheduler
    scheduler.limits = replace(scheduler.limits, max_num_seqs=batch)
    stats = scheduler.stats
    before = (stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_spec_steps)
    stop = frozenset(engine.runner.eos_token_ids)
    requests = [
        Request(f"r{i}", list(p), args.max_tokens, _seeded(options, i), stop)
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    engine.run(requests)
    seconds = time.perf_counter() - start
    run = Run(seconds, {r.request_id: r.output_token_ids for r in requests})
    run.draft_tokens = stats.num_draft_tokens - before[0]
    run.accepted_tokens = stats.num_accepted_tokens - before[1]
    run.spec_steps = stats.num_spec_steps - before[2]
    return run


def _seeded(options: SamplingOptions, i: int) -> SamplingOptions:
    if options.temperature == 0:
        return options
    return SamplingOptions(temperature=options.temperature, top_p=options.top_p, seed=1000 + i)


def _equal(runs: dict[str, Run], off: Run) -> str:
    """Requests whose greedy tokens equal speculation off's, in every mode."""
    same = sum(
        all(run.tokens[rid] == tokens for run in runs.values())
        for rid, tokens in off.tokens.items()
    )
    return f"{same}/{len(off.tokens)}"


def _spec(run: Run) -> str:
    if not run.draft_tokens:
        return "- / -"
    rate = run.accepted_tokens / run.draft_tokens
    return f"{rate:.2f} / {(run.accepted_tokens + run.spec_steps) / run.spec_steps:.2f}"


def speed(loaded, workloads: dict[str, list[list[int]]], args) -> None:
    engines = make_engines(loaded, args)
    warm_up = next(iter(workloads.values()))[:8]
    for engine in engines.values():  # what a server has learnt by the time traffic comes
        run_once(
            engine,
            warm_up,
            SamplingOptions(),
            8,
            argparse.Namespace(**{**vars(args), "max_tokens": min(32, args.max_tokens)}),
        )
    print(
        "| workload | concurrency | rows | off tok/s | fixed tok/s | adaptive tok/s | "
        "acceptance / mean accepted length, fixed | adaptive | greedy tokens equal |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = {"greedy": SamplingOptions(), "sampled": SamplingOptions(temperature=0.7, top_p=0.95)}
    decode_rows: list[str] = []
    for name, prompts in workloads.items():
        for batch in (int(b) for b in args.batches.split(",")):
            # 8 requests one by one; at 8, each prompt twice (32 requests through 8 slots, so
            # that the batch stays full: with as many requests as slots, the last one to finish
            # would run alone, and a closed run would measure that tail).
            chosen = prompts[::2] if batch == 1 else prompts * 2
            for row, options in rows.items():
                runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
                prompt_seconds = []  # at concurrency 1: the prompts' prefill and first token
                first = argparse.Namespace(**{**vars(args), "max_tokens": 1})
                for _ in range(args.repeats):  # interleaved: every mode sees the same machine
                    for mode in MODES:
                        run = run_once(engines[mode], chosen, options, batch, args)
                        runs[mode].append(run)
                    if batch == 1:
                        prompt_seconds.append(
                            run_once(engines["off"], chosen, options, batch, first).seconds
                        )
                tps = {
                    m: statistics.median(r.num_tokens / r.seconds for r in rs)
                    for m, rs in runs.items()
                }
                if prompt_seconds:
                    prefill = statistics.median(prompt_seconds)
                    decode = {
                        m: statistics.median(
                            (r.num_tokens - len(chosen)) / (r.seconds - prefill) for r in rs
                        )
                        for m, rs in runs.items()
                    }
                    decode_rows.append(
                        f"| {name} | {row} | {prefill / len(chosen) * 1e3:.0f} | "
                        f"{decode['off']:.1f} | {decode['fixed'] / decode['off']:.2f}x | "
                        f"{decode['adaptive'] / decode['off']:.2f}x |"
                    )
                last = {m: rs[-1] for m, rs in runs.items()}
                equal = _equal(last, last["off"]) if row == "greedy" else "n/a"
                print(
                    f"| {name} | {batch} | {row} | {tps['off']:.1f} | "
                    f"{tps['fixed']:.1f} ({tps['fixed'] / tps['off']:.2f}x) | "
                    f"{tps['adaptive']:.1f} ({tps['adaptive'] / tps['off']:.2f}x) | "
                    f"{_spec(last['fixed'])} | {_spec(last['adaptive'])} | {equal} |",
                    flush=True,
                )
    if decode_rows:
        print(
            "\nConcurrency 1, the decode alone: each run's time less its prompts' (the same "
            "prompts run to their first token, speculation off, median), tokens after the first"
        )
        print("\n| workload | rows | prompt + first token, ms a request | off decode tok/s | "
              "fixed | adaptive |")  # fmt: skip
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        print("\n".join(decode_rows), flush=True)


def gate(loaded, workloads: dict[str, list[list[int]]], args) -> None:
    """Greedy in float32: every mode's tokens equal speculation off's."""
    print("| workload | concurrency | requests | tokens | greedy tokens equal (fixed, adaptive) |")
    print("| --- | --- | --- | --- | --- |")
    for name, prompts in workloads.items():
        engines = make_engines(loaded, args)
        runs = {m: run_once(engines[m], prompts, SamplingOptions(), 8, args) for m in MODES}
        print(
            f"| {name} | 8 | {len(prompts)} | {runs['off'].num_tokens} | "
            f"{_equal(runs, runs['off'])} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=8, help="the most tokens proposed per step")
    parser.add_argument("--ngram-min", type=int, default=3)
    parser.add_argument("--ngram-max", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,8", help="concurrencies to run")
    parser.add_argument(
        "--workloads",
        default="grounded,open",
        help="grounded, open, long (the whole ~900-token text of public_domain.txt with a task "
        "that quotes or rewrites it)",
    )
    parser.add_argument(
        "--prompts", type=int, default=16, help="the first N prompts of each workload (a check)"
    )
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument(
        "--dtype", default="auto", help="the worker's --dtype (auto: what it picks on this machine)"
    )
    parser.add_argument(
        "--quantization",
        default="auto",
        help="the worker's --quantization (auto: what it picks for the file on this device)",
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (not yet run on a GPU)")
    parser.add_argument(
        "--gate",
        choices=("float32", "none"),
        default="float32",
        help="the greedy correctness gate's dtype (none: skip it)",
    )
    parser.add_argument(
        "--amx-tiles",
        choices=("on", "off"),
        default="on",
        help="off: the integer-activation linears stay on the vector kernel at every row count "
        "(the same bits; on an AMX CPU, a verify step's linears and head run on tiles)",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from services.worker.layers.int8_activations import amx_tiles

    print(f"AMX tiles for calls of 4+ rows: {amx_tiles(args.amx_tiles == 'on')}")
    from services.tokenizer.loader import load_tokenizer
    from services.worker.dtype_choice import resolve_dtype
    from services.worker.model.loader import default_path, load_model
    from services.worker.model.quant import quantize_loaded
    from services.worker.model.quant_choice import keeps_four_bit, resolve_quantization

    model = load_tokenizer(default_path())
    template = model.chat_template
    assert template is not None, "the default model ships a chat template"

    def encode(texts: list[str]) -> list[list[int]]:
        return [
            model.tokenizer.encode(template.render([{"role": "user", "content": text}])).ids
            for text in texts
        ]

    every = {"grounded": grounded_prompts, "open": lambda: OPEN, "long": long_prompts}
    workloads = {name: encode(every[name]()[: args.prompts]) for name in args.workloads.split(",")}
    device = torch.device(args.device)
    four_bit = keeps_four_bit(args.quantization, default_path(), device.type)
    dtype = resolve_dtype(args.dtype, device, four_bit_weights=four_bit).dtype
    quantization = resolve_quantization(args.quantization, default_path(), device.type, dtype)
    info = machine()
    print(
        f"# {info.get('cpu_model')}, {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}, load average {load_average()} at start, C++ CPU kernels "
        f"{info['cpu_extension']}"
    )
    print(
        f"# SmolLM2-135M {dtype}, quantization {quantization.method}, on {device}, k={args.k}, "
        f"n-grams {args.ngram_min}..{args.ngram_max}, "
        f"up to {args.max_tokens} output tokens (EOS ends a request), median of {args.repeats}"
    )
    loaded = load_model(default_path(), dtype=getattr(torch, dtype), device=device)
    speed(quantize_loaded(loaded, quantization.method), workloads, args)
    print(f"# load average {load_average()} after the speed rows")
    if args.gate != "none":
        print(f"\n# correctness gate: greedy, {args.gate}")
        loaded = load_model(default_path(), dtype=getattr(torch, args.gate), device=device)
        gate(loaded, workloads, args)
        print(f"# load average {load_average()} at the end")


if __name__ == "__main__":
    main()
