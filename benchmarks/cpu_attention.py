"""CPU attention in place vs the torch path's gather (issue 18), and with bf16 KV the
AVX512-BF16 passes vs issue 18's widening ones (issue 29), side by side in one run; int8 KV
(--kv-cache-dtype int8 under float32 compute, bf16+int8 under bfloat16) reads a quarter of
float32's bytes.

    PYTHONPATH=. .venv/bin/python -m benchmarks.cpu_attention [--threads 1] [--repeats 5]

Two tables, all backends interleaved (so all see the same machine); "widened" is the extension
with bf16 keys and values widened to float32 first (CpuAttention(avx512_bf16=False)), run for
bf16 only and only where the build has the AVX512-BF16 passes (else it is "in place" itself),
and for int8 where the build scores a decode's queries as int16 (VNNI or AVX2): its float32 queries:
- per layer: one layer's paged attention (with its metadata) on SmolLM2's shapes (9 q heads,
  3 KV heads, head dim 64), blocks shuffled across the pool as a long-running server leaves
  them; decode 64 x 1k and 8 x 2k, prefill batches, a mixed step. The per-step column is x30
  layers; GB/s counts the K/V bytes attention must read once (the floor either path moves).
- decode step: the real SmolLM2 forward + logits at 64 x 1k and 8 x 2k context (the KV cache
  is left as zeros: attention's cost does not depend on the values), attention timed inside
  the step: its share is what issue 18's goal (<= 25% at 64 x 1k) is about.
Needs the extension (make install, or python -m services.worker.layers.cpu_attention_ext).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from benchmarks.machine import ceilings, load_average
from services.worker.layers import cpu_attention_ext
from services.worker.layers.attention import StepAttention
from services.worker.layers.cpu_attention import CpuAttention, has_avx512_bf16, has_int16_queries
from services.worker.layers.kv_cache import PagedKVCache, bytes_per_block
from services.worker.layers.torch_attention import TorchAttention
from services.worker.model.config import LlamaConfig

BLOCK_SIZE = 16
LAYERS = 30
# name -> (compute dtype: q and the model, KV cache dtype)
DTYPES = {
    "fp32": (torch.float32, torch.float32),
    "bf16": (torch.bfloat16, torch.bfloat16),
    "int8": (torch.float32, torch.int8),
    "bf16+int8": (torch.bfloat16, torch.int8),  # a bfloat16 model over an int8 cache
}
# name -> (new tokens, context) per sequence
LAYER_CASES: dict[str, list[tuple[int, int]]] = {
    "decode 64 x 1k": [(1, 1024)] * 64,
    "decode 8 x 2k": [(1, 2048)] * 8,
    "prefill 4 x 512": [(512, 512)] * 4,
    "chunk 256 after 768 cached, x4": [(256, 1024)] * 4,
    "mixed: 63 decodes at 1k + chunk 256": [(1, 1024)] * 63 + [(256, 256)],
}
STEP_CASES = {"decode 64 x 1k": (64, 1024), "decode 8 x 2k": (8, 2048)}


class TimedBackend:
    """A backend whose paged_attention calls are timed (everything else forwarded)."""

    def __init__(self, inner: TorchAttention) -> None:
        self.inner = inner
        self.seconds = 0.0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def paged_attention(self, *args, **kwargs) -> torch.Tensor:
        started = CLOCK[0]()
        out = self.inner.paged_attention(*args, **kwargs)
        self.seconds += CLOCK[0]() - started
        return out


def smollm2_shapes(max_positions: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=1, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=1e5, rms_norm_eps=1e-5,
        max_position_embeddings=max_positions, tie_word_embeddings=True, eos_token_ids=(0,),
    )  # fmt: skip


def shuffled_tables(contexts: list[int], num_blocks: int, seed: int = 0) -> list[list[int]]:
    """Each sequence's blocks drawn from a shuffled pool (block 0 left as the padding block)."""
    pool = list(range(1, num_blocks))
    random.Random(seed).shuffle(pool)
    tables, used = [], 0
    for context in contexts:
        count = -(-context // BLOCK_SIZE)
        tables.append(pool[used : used + count])
        used += count
    return tables


def blocks_needed(contexts: list[int]) -> int:
    return sum(-(-c // BLOCK_SIZE) for c in contexts) + 1


# The clock every time is read from: the thread's CPU time by default (--clock cpu, with one
# thread), so that other work on a shared machine that preempts the run is not counted; wall
# time with --clock wall (and whenever several threads run).
CLOCK: list[Callable[[], float]] = [time.thread_time]


def interleaved(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each fn, run in turn `repeats` times after one warm-up each."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            started = CLOCK[0]()
            fn()
            times[name].append(CLOCK[0]() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def layer_row(name: str, seqs: list[tuple[int, int]], dtypes: str, repeats: int) -> str:
    dtype, kv_dtype = DTYPES[dtypes]
    query_lens, contexts = [q for q, _ in seqs], [c for _, c in seqs]
    config = smollm2_shapes(max(contexts))
    cache = PagedKVCache(config, blocks_needed(contexts), BLOCK_SIZE, kv_dtype, torch.device("cpu"))
    for layer_cache in cache.layer(0):
        if layer_cache.dtype == torch.int8:
            layer_cache.random_(-127, 128)
        else:
            layer_cache.normal_()
    tables = shuffled_tables(contexts, cache.num_blocks)
    q = torch.randn(sum(query_lens), config.num_heads, config.head_dim).to(dtype)
    cpu = torch.device("cpu")

    def run(backend: TorchAttention) -> Callable[[], object]:
        def step() -> object:
            meta = backend.metadata(query_lens, contexts, tables, BLOCK_SIZE, cpu)
            return backend.paged_attention(q, cache.layer(0), meta)

        return step

    t = interleaved({k: run(b) for k, b in _backends(kv_dtype, lambda b: b).items()}, repeats)
    # K and V of every key each query span reads, once (prefill: the sequence's whole context),
    # an int8 cache's scales included.
    kv_bytes = sum(contexts) * bytes_per_block(config, 1, kv_dtype)
    before, after = 1e3 * t["torch"], 1e3 * t["in place"]
    widened = f"{1e3 * t['widened']:.2f}" if "widened" in t else "-"
    return (
        f"| {name} | {dtypes} | {before:.2f} | {widened} | {after:.2f} "
        f"| {before / after:.1f}x | {LAYERS * before:.0f} | {LAYERS * after:.0f} "
        f"| {kv_bytes / t['in place'] / 1e9:.1f} |"
    )


def _backends(dtype: torch.dtype, wrap: Callable) -> dict:
    """torch, widened (bf16 with the AVX512-BF16 passes built in; int8 with int16 decode
    queries built in: its float32 scores) and in place, each wrapped."""
    backends = {"torch": wrap(TorchAttention())}
    if (dtype == torch.bfloat16 and has_avx512_bf16()) or (
        dtype == torch.int8 and has_int16_queries()
    ):
        backends["widened"] = wrap(CpuAttention(avx512_bf16=False))
    backends["in place"] = wrap(CpuAttention())
    return backends


def step_row(name: str, batch: int, context: int, loaded, dtypes: str, repeats: int) -> str:
    kv_dtype = DTYPES[dtypes][1]
    model, cpu = loaded.model, torch.device("cpu")
    contexts = [context] * batch
    cache = PagedKVCache(loaded.config, blocks_needed(contexts), BLOCK_SIZE, kv_dtype, cpu)
    tables = shuffled_tables(contexts, cache.num_blocks)
    ids = torch.randint(0, loaded.config.vocab_size, (batch,))
    backends = _backends(kv_dtype, TimedBackend)

    def run(backend: TimedBackend) -> Callable[[], object]:
        def step() -> object:
            attn = StepAttention.build([1] * batch, contexts, [tables], BLOCK_SIZE, cpu, backend)
            with torch.inference_mode():
                return model.compute_logits(model(ids, attn.positions, attn, cache))

        return step

    # Attention seconds per step: the median step's share, from totals over the timed steps.
    fns = {k: run(b) for k, b in backends.items()}
    for fn in fns.values():
        fn()
    for b in backends.values():
        b.seconds = 0.0
    t = interleaved(fns, repeats)
    att = {k: b.seconds / (repeats + 1) for k, b in backends.items()}  # +1: interleaved's warm-up
    cells = {k: f"{1e3 * t[k]:.0f} | {1e3 * att[k]:.0f} ({att[k] / t[k]:.0%})" for k in t}
    return (
        f"| {name} | {dtypes} | {cells['torch']} | {cells.get('widened', '- | -')} "
        f"| {cells['in place']} | {t['torch'] / t['in place']:.2f}x |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtypes", default="fp32,bf16,int8", help="of " + ",".join(DTYPES))
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--skip-steps", action="store_true", help="per-layer table only")
    parser.add_argument(
        "--weights",
        choices=("dense", "gguf"),
        default="dense",
        help="the step's linears: dense float weights, or the file's 4-bit kept (the CPU "
        "default's; float32 compute only)",
    )
    args = parser.parse_args()
    if not cpu_attention_ext.load():
        raise SystemExit(
            "the extension is not built: python -m services.worker.layers.cpu_attention_ext"
        )
    torch.set_num_threads(args.threads)
    if args.clock == "wall" or args.threads > 1:
        CLOCK[0] = time.perf_counter
    dtypes = args.dtypes.split(",")
    if unknown := set(dtypes) - set(DTYPES):
        raise SystemExit(f"--dtypes takes {', '.join(DTYPES)}, not {', '.join(unknown)}")
    ceiling = ceilings()
    clock = "thread CPU time" if CLOCK[0] is time.thread_time else "wall time"
    print(f"{args.threads} thread(s), {clock}, load average at start {load_average()}, torch "
          f"{torch.__version__}, ceilings {ceiling}, "
          f"AVX512-BF16 passes built in: {has_avx512_bf16()}")  # fmt: skip
    print("\nPer layer (ms), torch path (gather) vs in place (C++ extension):\n")
    print("| case | dtype | torch | widened | in place | speed-up | torch x30 | in place x30 "
          "| GB/s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for dtypes_name in dtypes:
        for name, seqs in LAYER_CASES.items():
            print(layer_row(name, seqs, dtypes_name, args.repeats), flush=True)
    if args.skip_steps:
        return
    weights = f"{args.weights} weights"
    print(f"\nSmolLM2 decode step (forward + logits, ms, {weights}), attention inside it:\n")
    print("| case | dtype | step, torch | attention, torch | step, widened | attention, "
          "widened | step, in place | attention, in place | step speed-up |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    from services.worker.model.loader import default_path, load_model
    from services.worker.model.quant import quantize_loaded

    models = {}  # compute dtype -> the model loaded in it (fp32 and int8 share one)
    for dtypes_name in dtypes:
        dtype = DTYPES[dtypes_name][0]
        if dtype not in models:
            models[dtype] = load_model(default_path(), dtype=dtype, device=torch.device("cpu"))
            if args.weights == "gguf" and dtype == torch.float32:
                models[dtype] = quantize_loaded(models[dtype], "gguf")
        for name, (batch, context) in STEP_CASES.items():
            row = step_row(name, batch, context, models[dtype], dtypes_name, args.repeats)
            print(row, flush=True)
    print(f"\nload average at the end {load_average()}")


if __name__ == "__main__":
    main()
