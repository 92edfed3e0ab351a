"""What sampling costs in a decode step (issue 18): the worker's ModelRunner on SmolLM2, one
static batch, every row greedy vs every row sampled differently (temperature, top-p, top-k,
min-p, a seed each, as real clients send), steps interleaved so both see the same machine.

    PYTHONPATH=. .venv/bin/python -m benchmarks.sampling_cost [--batch 64] [--steps 12]

The sampler is also timed inside the sampled steps, on the model's real logits: its share of
the step is sampler time / sampled step time. On the same logits after each step, alternating:
the sampler with the C++ ops (csrc/sampling_ops.cpp: candidates and argmax), the sampler with
torch's ops in their place, and the sort-based draw from before issue 18.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks.model_decode import _Batch
from benchmarks.offline import BLOCK_SIZE, make_runner
from services.common.sampling import SamplingOptions
from services.worker.engine import sampler as sampler_module
from services.worker.engine.sampler import Sampler, row_seed, sampling_probs


def client_options(batch: int, seed: int) -> list[SamplingOptions]:
    """Every row different, in the ranges clients send."""
    rng = random.Random(seed)
    return [
        SamplingOptions(
            temperature=rng.choice([0.6, 0.7, 0.8, 1.0, 1.2]),
            top_p=rng.choice([1.0, 0.9, 0.95, 0.8]),
            top_k=rng.choice([0, 0, 40, 50]),
            min_p=rng.choice([0.0, 0.0, 0.05]),
            seed=rng.randrange(2**31),
        )
        for _ in range(batch)
    ]


TEXT = Path(__file__).parent / "data" / "public_domain.txt"


def text_prompts(batch: int, context: int) -> list[list[int]]:
    """Windows of real English text (the model's next-token distributions are those of real
    traffic; random token ids would make them flat, which top-p handles far more slowly)."""
    from services.tokenizer.loader import load_tokenizer

    ids = load_tokenizer().encode(TEXT.read_text(), add_special_tokens=False)
    stride = max(1, (len(ids) - context) // batch)
    return [ids[i * stride : i * stride + context] for i in range(batch)]


class TimedSampler(Sampler):
    """The runner's sampler, timed inside the real step on the real logits, which it keeps for
    the baseline to be timed on afterwards, outside the step."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.last: tuple | None = None

    def sample(self, logits, options, prompt_token_ids, output_token_ids, **kwargs):
        started = time.perf_counter()
        out = super().sample(logits, options, prompt_token_ids, output_token_ids, **kwargs)
        self.seconds.append(time.perf_counter() - started)
        self.last = (logits.clone(), options, [len(t) for t in output_token_ids])
        return out


def sort_based_draw(logits, options: list[SamplingOptions], counts: list[int]) -> torch.Tensor:
    """The sampler before issue 18: a copy of the logits, the dense distribution (a sort of the
    whole vocabulary for top-p), then one generator per seeded row."""
    probs = sampling_probs(logits.float().clone(), options)
    drawn = torch.empty(len(options), dtype=torch.int64)
    for i, option in enumerate(options):
        generator = torch.Generator().manual_seed(row_seed(option.seed or 0, counts[i]))
        drawn[i] = torch.multinomial(probs[i], 1, generator=generator)[0]
    return drawn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from services.worker.model.loader import default_path, load_model

    loaded = load_model(default_path(), dtype=torch.float32, device=torch.device("cpu"))
    blocks_each = -(-(args.context + args.steps + 2) // BLOCK_SIZE) + 1
    runner = make_runner(loaded, 2 * args.batch * blocks_each + 8)
    prompts = text_prompts(args.batch, args.context)
    options = client_options(args.batch, 1)
    timed = runner._sampler = TimedSampler()
    greedy = _Batch(runner, prompts, "greedy")
    sampled = _Batch(runner, prompts, "sampled", options)
    times: dict[str, list[float]] = {
        "greedy": [], "sampled": [], "sampler": [], "C++ ops": [], "torch ops": [], "before": []
    }  # fmt: skip
    for _ in range(args.steps):
        for name, batch in (("greedy", greedy), ("sampled", sampled)):
            started = time.perf_counter()
            batch.step()
            times[name].append(time.perf_counter() - started)
        times["sampler"].append(timed.seconds[-1])  # the sampled step's
        logits, step_options, counts = timed.last
        times["C++ ops"].append(sample_seconds(logits, step_options, counts, native=True))
        times["torch ops"].append(sample_seconds(logits, step_options, counts, native=False))
        started = time.perf_counter()
        sort_based_draw(*timed.last)  # the same logits, after the step
        times["before"].append(time.perf_counter() - started)
    greedy.finish()
    sampled.finish()
    g, s, a, n, t, b = (
        1e3 * statistics.median(times[k])
        for k in ("greedy", "sampled", "sampler", "C++ ops", "torch ops", "before")
    )
    load = os.getloadavg()[0]
    print(f"batch {args.batch}, context {args.context}, {args.threads} thread(s), load {load:.1f}")
    print(
        "| decode step greedy | decode step sampled | sampled / greedy | sampler | share "
        "| after the step: C++ ops | torch ops | sort-based draw (before) | its share |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print(
        f"| {g:.1f} ms | {s:.1f} ms | {s / g:.3f} | {a:.2f} ms | {a / s:.1%} "
        f"| {n:.2f} ms | {t:.2f} ms | {b:.2f} ms | {b / (s - a + b):.1%} |"
    )


def sample_seconds(
    logits, options: list[SamplingOptions], counts: list[int], native: bool
) -> float:
    """Seconds of the sampler on these logits, with the C++ sampling ops or torch's in their
    place (topk, logsumexp, argmax)."""
    ops = sampler_module._native_ops
    if not native:
        sampler_module._native_ops = lambda: False
    try:
        outputs = [[0] * count for count in counts]
        started = time.perf_counter()
        Sampler().sample(logits, options, [[] for _ in options], outputs)
        return time.perf_counter() - started
    finally:
        sampler_module._native_ops = ops


if __name__ == "__main__":
    main()
