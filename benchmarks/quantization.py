"""Weight-only int8 and 4-bit against the float model they came from, side by side in one run.

    PYTHONPATH=. .venv/bin/python -m benchmarks.quantization [--threads 1] [--reps 3]
        [--batches 1 8 64] [--cpu-time] [--kernel-sweep]

One load of the bundled SmolLM2-135M-Instruct GGUF (float32), then copies: int8 on float32
(the worker's --quantization int8; also with the tied embedding/head in int8), the file's Q4_1
weights kept 4-bit (--quantization gguf, the CPU default), bfloat16, int8, Q4_1 kept 4-bit and
int4 from the float weights (--quantization int4) on bfloat16; the two int8 variants timed
with both int8_linear kernels. Per variant:
- weight bytes (parameters and persistent buffers; int8 values + scales);
- decode tok/s at batch 1 and 32: the worker's ModelRunner, a static batch of 64-token
  prompts prefilled in one step (untimed), then --steps timed decode steps; median of --reps
  (--threads 1 by default: on a shared machine, more threads than free cores slow it badly);
- perplexity of benchmarks/data/public_domain.txt through the model's own forward, and the
  share of its positions where the top-1 next token equals float32's (teacher-forced);
- greedy agreement with float32 on 16 prompts x 32 tokens: the share of tokens before the
  first divergence, and how many prompts match exactly.
Quality does not depend on the kernel (the same weights), so it is measured once per variant."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import math
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.machine import load_average, machine
from services.tokenizer.loader import load_tokenizer
from services.worker.engine.model_runner import ModelRunner
from services.worker.engine.plan import NewSequence, RunningSequence, StepPlan
from services.worker.layers.attention import StepAttention
from services.worker.layers.attention_backends import torch_backend
from services.worker.layers.int8_weight import ByRows, Int8Weight, int8_kernel
from services.worker.layers.kv_cache import PagedKVCache
from services.worker.model.loader import LoadedModel, default_path, load_model
from services.worker.model.quant import quantize_loaded, weight_bytes

TEXT = Path(__file__).parent / "data" / "public_domain.txt"
BLOCK_SIZE = 16
CPU = torch.device("cpu")
PROMPT_LEN = 64  # decode-speed prompts: random ids, the same for every variant
GREEDY_TOKENS = 32
# Wall time, or with --cpu-time this thread's CPU time: with one torch thread all of a step's
# work runs on it, and the CPU time does not count the time other processes held the core.
CLOCK = [time.perf_counter]
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about autumn.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHow do I reverse a list in Python?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nGive me a tip for sleeping better.<|im_end|>\n<|im_start|>assistant\n",
    "Water boils at one hundred degrees Celsius at sea level, but on a mountain",
    "Once upon a time, in a small village by the sea, there lived",
    "The three laws of motion, first stated by Isaac Newton, say that",
    "1, 2, 3, 5, 8, 13, 21, 34,",
    "SELECT name, age FROM users WHERE",
    "The mitochondria is the powerhouse of the cell because",
    "Dear hiring manager, I am writing to apply for",
    "In 1969, the Apollo 11 mission",
]


@dataclasses.dataclass
class Result:
    name: str
    kernel: str
    weight_bytes: int
    tok_s: dict[int, float]  # batch -> median decode tok/s
    quality: dict[str, float] | None = None  # None: same weights as the row above


class StaticBatch:
    """Prompts run together on the worker's ModelRunner: one step prefills them all (and
    samples each one's first token), then every step decodes one token for each."""

    def __init__(self, loaded: LoadedModel, prompts: list[list[int]], max_new: int) -> None:
        dtype = loaded.model.embed_tokens.dtype
        per_seq = -(-(max(map(len, prompts)) + max_new) // BLOCK_SIZE)
        cache = PagedKVCache(loaded.config, per_seq * len(prompts), BLOCK_SIZE, dtype, CPU)
        self.runner = ModelRunner(
            loaded, cache, max_model_len=4096, model_name="bench", backend=torch_backend()
        )
        self.ids = [f"s{i}" for i in range(len(prompts))]
        new = [
            NewSequence(rid, p, len(p), 0, len(p), [list(range(i * per_seq, (i + 1) * per_seq))])
            for i, (rid, p) in enumerate(zip(self.ids, prompts, strict=True))
        ]
        sampled = self.runner.execute(StepPlan(new=new))
        self.outputs = {s.request_id: [s.token_id] for s in sampled}

    def decode(self, steps: int) -> float:
        """Runs `steps` decode steps; returns their seconds (CLOCK's)."""
        started = CLOCK[0]()
        for _ in range(steps):
            plan = StepPlan(running=[RunningSequence(rid, 1, [[]]) for rid in self.ids])
            for s in self.runner.execute(plan):
                self.outputs[s.request_id].append(s.token_id)
        return CLOCK[0]() - started


def greedy(loaded: LoadedModel, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    batch = StaticBatch(loaded, prompts, new_tokens)
    batch.decode(new_tokens - 1)
    return [batch.outputs[rid] for rid in batch.ids]


def decode_tok_s(loaded: LoadedModel, batch: int, steps: int, reps: int, kernel: str) -> float:
    """Median over `reps` runs of `steps` decode steps of `batch` 64-token random prompts, the
    int8 weights (if any) computing with `kernel`; the prefill runs with the default kernel."""
    generator = torch.Generator().manual_seed(batch)
    vocab = loaded.config.vocab_size
    prompts = [
        torch.randint(vocab, (PROMPT_LEN,), generator=generator).tolist() for _ in range(batch)
    ]
    set_kernel(loaded, "auto")
    static = StaticBatch(loaded, prompts, 2 + steps * reps)
    set_kernel(loaded, kernel)
    static.decode(1)  # warm-up
    times = [static.decode(steps) for _ in range(reps)]
    set_kernel(loaded, "auto")
    return batch * steps / statistics.median(times)


@torch.inference_mode()
def text_logits(loaded: LoadedModel, ids: list[int]) -> torch.Tensor:
    """Next-token logits [T, V] float32 for every position of `ids`: one prefill through the
    model's own forward and paged KV cache, as the worker runs it."""
    blocks = list(range(-(-len(ids) // BLOCK_SIZE)))
    dtype = loaded.model.embed_tokens.dtype
    cache = PagedKVCache(loaded.config, len(blocks), BLOCK_SIZE, dtype, CPU)
    attn = StepAttention.build([len(ids)], [len(ids)], [[blocks]], BLOCK_SIZE, CPU)
    hidden = loaded.model(torch.tensor(ids), attn.positions, attn, cache)  # [T, d]
    return loaded.model.compute_logits(hidden)


def quality(
    loaded: LoadedModel,
    text: list[int],
    prompts: list[list[int]],
    reference: tuple[torch.Tensor, list[list[int]]] | None,
) -> tuple[dict[str, float], tuple[torch.Tensor, list[list[int]]]]:
    """Perplexity, top-1 agreement on the text and greedy agreement with `reference` (the
    float32 logits and greedy outputs; None: this is the reference)."""
    logits = text_logits(loaded, text)
    nll = F.cross_entropy(logits[:-1], torch.tensor(text[1:]))
    outputs = greedy(loaded, prompts, GREEDY_TOKENS)
    ref_logits, ref_outputs = reference or (logits, outputs)
    prefixes = [_prefix(a, b) for a, b in zip(ref_outputs, outputs, strict=True)]
    top1 = (logits.argmax(-1) == ref_logits.argmax(-1)).float().mean()
    found = {
        "perplexity": math.exp(float(nll)),
        "top1_agree": float(top1),
        "greedy_prefix": sum(prefixes) / (GREEDY_TOKENS * len(prompts)),
        "greedy_exact": sum(p == GREEDY_TOKENS for p in prefixes),
    }
    return found, (logits, outputs)


def _prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), len(a))


def set_kernel(loaded: LoadedModel, kernel: str) -> None:
    for buffer in loaded.model.buffers():
        if isinstance(buffer, Int8Weight):
            buffer.kernel = int8_kernel(kernel, buffer.device, buffer.dtype)


def batch_one_kernel(dtype: torch.dtype) -> str:
    """The kernel "auto" runs on the CPU for one activation row of `dtype`."""
    kernel = int8_kernel("auto", CPU, dtype)
    return (kernel.small if isinstance(kernel, ByRows) else kernel).name


def variants(base: LoadedModel) -> Iterator[tuple[str, LoadedModel, bool]]:
    """(name, model, time both int8 kernels): float32, int8 on float32 (also with the tied
    embedding/head in int8), the file's Q4_1 kept 4-bit, bfloat16, int8 on bfloat16, Q4_1 kept
    4-bit and int4 from floats on bfloat16; at most two copies besides base."""
    yield "float32", base, False
    yield "int8 (float32 activations)", _copy(base, None, "int8"), True
    yield "int8 + embedding/head (float32)", _copy(base, None, "int8", embeddings=True), False
    yield "Q4_1 kept 4-bit (float32 activations)", _copy(base, None, "gguf"), False
    half = _copy(base, torch.bfloat16, "none")
    yield "bfloat16", half, False
    yield "int8 (bfloat16 activations)", _copy(half, None, "int8"), True
    yield "Q4_1 kept 4-bit (bfloat16 activations)", _copy(half, None, "gguf"), False
    yield "int4 from the float weights (bfloat16)", _copy(half, None, "int4"), False


def _copy(
    loaded: LoadedModel, dtype: torch.dtype | None, method: str, embeddings: bool = False
) -> LoadedModel:
    model = copy.deepcopy(loaded.model)
    if dtype is not None:
        for param in model.parameters():
            param.data = param.data.to(dtype)
    return quantize_loaded(dataclasses.replace(loaded, model=model), method, embeddings=embeddings)


def run(args: argparse.Namespace) -> list[Result]:
    tokenizer = load_tokenizer(default_path()).tokenizer
    text = tokenizer.encode(TEXT.read_text()).ids
    prompts = [tokenizer.encode(p).ids for p in PROMPTS]
    base = load_model(default_path(), dtype=torch.float32, device=CPU)
    results: list[Result] = []
    reference = None
    for name, loaded, both_kernels in variants(base):
        found, measured = quality(loaded, text, prompts, reference)
        reference = reference or measured
        quantized = any(isinstance(b, Int8Weight) for b in loaded.model.buffers())
        dtype = loaded.model.embed_tokens.dtype
        # "auto" picks per call by the batch (int8_weight.ByRows); each kernel alone besides.
        others = sorted({"dequant", "int8pack"}) if both_kernels else []
        kernels = ["auto", *others] if quantized else ["-"]
        for kernel in kernels:
            # A kernel the worker would not pick at batch 1 can be 30x slower: fewer steps.
            default = batch_one_kernel(dtype)
            steps = args.steps if kernel in ("auto", default, "-") else args.other_kernel_steps
            speeds = {b: decode_tok_s(loaded, b, steps, args.reps, kernel) for b in args.batches}
            label = f"{kernel} (default)" if quantized and kernel == "auto" else kernel
            row = Result(name, label, weight_bytes(loaded.model), speeds, found)
            results.append(row)
            print(_row(row, results[0]), flush=True)
            found = None
    return results


def kernel_sweep(args: argparse.Namespace) -> None:
    """int8 weights on bfloat16 activations: decode tok/s with each int8_linear kernel at each
    batch, the kernels interleaved per batch; where int8pack stops winning is the switch point
    (quant.INT8PACK_MAX_ROWS)."""
    base = load_model(default_path(), dtype=torch.float32, device=CPU)
    loaded = _copy(_copy(base, torch.bfloat16, "none"), None, "int8")
    del base
    print("| batch | int8pack tok/s | dequant tok/s | int8pack / dequant |")
    print("| --- | --- | --- | --- |")
    for batch in args.batches:
        speeds: dict[str, list[float]] = {"int8pack": [], "dequant": []}
        for _ in range(args.reps):
            for kernel, found in speeds.items():
                found.append(decode_tok_s(loaded, batch, args.steps, 1, kernel))
        pack, deq = (statistics.median(speeds[k]) for k in ("int8pack", "dequant"))
        print(f"| {batch} | {pack:.1f} | {deq:.1f} | {pack / deq:.2f}x |", flush=True)


def _row(r: Result, base: Result) -> str:
    mib = r.weight_bytes / 2**20
    cells = [r.name, r.kernel, f"{mib:.0f} MiB ({r.weight_bytes / base.weight_bytes:.2f}x)"]
    cells += [f"{r.tok_s[b]:.1f} ({r.tok_s[b] / base.tok_s[b]:.2f}x)" for b in sorted(r.tok_s)]
    if r.quality is None:
        cells += ["same weights"] * 4
    else:
        q = r.quality
        cells += [f"{q['perplexity']:.3f}", f"{q['top1_agree']:.1%}"]
        cells += [f"{q['greedy_prefix']:.1%}", f"{int(q['greedy_exact'])}/{len(PROMPTS)}"]
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.quantization")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--reps", type=int, default=3, help="decode timings per figure (median)")
    p.add_argument("--steps", type=int, default=16, help="timed decode steps per repetition")
    p.add_argument("--other-kernel-steps", type=int, default=4, help="the same, other kernel")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time steps by this thread's CPU time (needs --threads 1): on a busy machine, "
        "what a step costs on a core of its own",
    )
    p.add_argument(
        "--kernel-sweep",
        action="store_true",
        help="only int8 on bfloat16, both kernels per batch (the kernel switch point)",
    )
    args = p.parse_args()
    if args.cpu_time and args.threads != 1:
        p.error("--cpu-time needs --threads 1")
    torch.set_num_threads(args.threads)
    CLOCK[0] = time.thread_time if args.cpu_time else time.perf_counter
    print(f"machine: {machine()}")
    print(f"cpu capability: {torch.backends.cpu.get_cpu_capability()}")
    if args.kernel_sweep:
        kernel_sweep(args)
        return
    batches = " | ".join(f"decode tok/s, batch {b}" for b in sorted(args.batches))
    print(f"| weights | int8 kernel | weight memory | {batches} | perplexity | top-1 = float32 "
          "| greedy tokens = float32 | greedy exact |")  # fmt: skip
    print("| --- " * (8 + len(args.batches) - 1) + "|")
    run(args)
    print(f"load average at the end: {load_average()}")


if __name__ == "__main__":
    main()
