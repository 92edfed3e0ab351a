"""Speculative decoding with n-gram lookup (issue 21): output tokens/s with speculation off and
on, side by side in one run, on the real SmolLM2 through the engine (L2: scheduler + model
runner in one process, benchmarks/offline.py).

Workloads (PERFORMANCE.md (f) and a control):
- grounded: chat prompts that ask to rewrite a passage of benchmarks/data/public_domain.txt or to
  edit a code snippet: the output repeats the input, the n-gram proposer's case;
- open: chat prompts whose answers do not repeat them (stories, lists, explanations).

Each at batch 1 and 8, greedy and sampled rows (temperature 0.7, top_p 0.95, a seed per
request), a fixed number of output tokens (EOS ignored). Off and on runs alternate, each
repeated; the median counts. Greedy rows are the correctness gate: their tokens with
speculation on must equal those with it off. Also reported: acceptance rate (accepted / proposed
tokens) and mean accepted length (tokens per step that carried proposals).

    python -m benchmarks.spec_decode                # k 4, n-grams 2..4, 96 tokens, 3 repeats
    python -m benchmarks.spec_decode --k 3 --repeats 1 --max-tokens 48
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
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
OPEN = [
    "Write a short story about a lighthouse keeper who finds a strange map.",
    "List ten creative names for a coffee shop and explain each one.",
    "Explain how a rainbow forms, as if to a curious child.",
    "Describe your ideal weekend in the mountains.",
    "Give five tips for learning a new language quickly.",
    "Invent a new board game and describe its rules.",
    "Write a letter from a cat to its owner about breakfast.",
    "What would a city on Mars look like in the year 2200?",
]


def grounded_prompts() -> list[str]:
    passages = [p for p in TEXT.read_text().split("\n\n") if len(p) > 300][:4]
    rewrite = [
        f"Rewrite the following passage in plain modern English, keeping it close to the "
        f"original:\n\n{passage}"
        for passage in passages
    ]
    edit = [
        f"Add type hints and a docstring to this Python code, and return the whole code:\n\n"
        f"```python\n{code}```"
        for code in CODE
    ]
    return [p for pair in zip(rewrite, edit, strict=True) for p in pair]


@dataclass(slots=True)
class Run:
    seconds: float
    tokens: dict[str, list[int]]
    draft_tokens: int
    accepted_tokens: int
    spec_steps: int


def run_once(
    loaded, prompts: list[list[int]], options: SamplingOptions, max_tokens: int, k: int, n: tuple
) -> Run:
    proposer = NgramProposer(n[0], n[1], k) if k else None
    limits = SchedulerLimits(max_num_batched_tokens=1024, max_num_seqs=len(prompts))
    engine = OfflineEngine(make_runner(loaded, num_blocks=1024), limits, proposer=proposer)
    requests = [
        Request(f"r{i}", list(p), max_tokens, _seeded(options, i), frozenset())
        for i, p in enumerate(prompts)
    ]
    start = time.perf_counter()
    engine.run(requests)
    seconds = time.perf_counter() - start
    tokens = {r.request_id: r.output_token_ids for r in requests}
    spec = engine.scheduler.speculator
    if spec is None:
        return Run(seconds, tokens, 0, 0, 0)
    return Run(
        seconds, tokens, spec.num_draft_tokens, spec.num_accepted_tokens, spec.num_spec_steps
    )


def _seeded(options: SamplingOptions, i: int) -> SamplingOptions:
    if options.temperature == 0:
        return options
    return SamplingOptions(temperature=options.temperature, top_p=options.top_p, seed=1000 + i)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=4, help="tokens proposed per step")
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from services.tokenizer.loader import load_tokenizer
    from services.worker.model.loader import default_path, load_model

    model = load_tokenizer(default_path())
    loaded = load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))

    template = model.chat_template
    assert template is not None, "the default model ships a chat template"

    def encode(texts: list[str]) -> list[list[int]]:
        return [
            model.tokenizer.encode(template.render([{"role": "user", "content": text}])).ids
            for text in texts
        ]

    workloads = {"grounded": encode(grounded_prompts()), "open": encode(OPEN)}
    info = machine()
    print(
        f"# {info.get('cpu_model')}, {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}, load average {load_average()} at start"
    )
    print(
        f"# SmolLM2-135M fp32, k={args.k}, n-grams {args.ngram_min}..{args.ngram_max}, "
        f"{args.max_tokens} output tokens (EOS ignored), median of {args.repeats}"
    )
    print(
        "| workload | batch | rows | off tok/s | on tok/s | speedup | acceptance | "
        "mean accepted length | greedy tokens equal |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = {
        "greedy": SamplingOptions(),
        "sampled": SamplingOptions(temperature=0.7, top_p=0.95),
    }
    n = (args.ngram_min, args.ngram_max)
    for name, prompts in workloads.items():
        for batch in (int(b) for b in args.batches.split(",")):
            chosen = prompts[:batch]
            for row, options in rows.items():
                off, on = [], []
                for _ in range(args.repeats):  # interleaved: both see the same machine
                    off.append(run_once(loaded, chosen, options, args.max_tokens, 0, n))
                    on.append(run_once(loaded, chosen, options, args.max_tokens, args.k, n))
                total = batch * args.max_tokens
                off_tps = total / statistics.median(r.seconds for r in off)
                on_tps = total / statistics.median(r.seconds for r in on)
                last = on[-1]
                rate = last.accepted_tokens / last.draft_tokens if last.draft_tokens else 0.0
                length = (
                    (last.accepted_tokens + last.spec_steps) / last.spec_steps
                    if last.spec_steps
                    else 1.0
                )
                equal = (
                    ("yes" if on[-1].tokens == off[-1].tokens else "NO")
                    if row == "greedy"
                    else "n/a"
                )
                print(
                    f"| {name} | {batch} | {row} | {off_tps:.1f} | {on_tps:.1f} | "
                    f"{on_tps / off_tps:.2f}x | {rate:.2f} | {length:.2f} | {equal} |",
                    flush=True,
                )
    print(f"# load average {load_average()} at the end")


if __name__ == "__main__":
    main()
