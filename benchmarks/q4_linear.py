"""The float32 4-bit linear op against what it replaced, per call, on SmolLM2-135M's shapes.

    PYTHONPATH=. .venv/bin/python -m benchmarks.q4_linear [--threads 1] [--rows 1 4 16 64 256]

torch.ops.layerserve.q4_linear (csrc/q4_matmul.cpp, Int4Weight's kernel for float32 rows up to
Q4_OP_MAX_ROWS) against int4pack with its casts to bfloat16 and back (Int4PackMM) and
dequantize-then-GEMM (DequantMM), for the model's four 4-bit shapes: q/k/v's 576 x 576 and
192 x 576 pieces, gate/up's 1536 x 576 and down's 576 x 1536. The weights are GGUF-like
(float16 scales and offsets, as a Q4_1 file's) and each call takes the next of --copies copies,
so that it reads its weight from memory as a decode step does. ms a call, the minimum of three
passes: by this thread's CPU time with one thread, by wall clock with more. Prints a Markdown
table (docs/benchmarks.md, "4-bit weights")."""

from __future__ import annotations

import argparse
import time

import torch

from services.worker.layers import cpu_attention_ext
from services.worker.layers.gguf_quant import GroupQuant
from services.worker.layers.int4_weight import DEQUANT, INT4PACK, Q4_OP, Int4Weight, quantize_int4

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536))  # (out, in)
KERNELS = {"q4_linear": Q4_OP, "int4pack + casts": INT4PACK, "dequantize + GEMM": DEQUANT}


def gguf_like(out: int, cols: int) -> Int4Weight:
    """A random float32 Int4Weight with float16-exact scales and offsets, as a Q4_1 file's."""
    groups = quantize_int4(torch.randn(out, cols))
    scale, offset = groups.scale.half().float(), groups.offset.half().float()
    return Int4Weight(GroupQuant(groups.q, scale, offset, bits=4), torch.float32)


def ms_per_call(kernel, x: torch.Tensor, weights: list[Int4Weight], clock) -> float:
    best = float("inf")
    for _ in range(3):
        started = clock()
        for weight in weights:
            kernel(x, weight)
        best = min(best, (clock() - started) / len(weights))
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.q4_linear")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--copies", type=int, default=24, help="weights cycled per shape")
    args = p.parse_args()
    if not cpu_attention_ext.load():
        raise SystemExit("the C++ extension is not built: make install")
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"threads {args.threads} ({'thread CPU time' if args.threads == 1 else 'wall clock'})")
    print("| shape (out x in) | rows | " + " | ".join(KERNELS) + " |")
    print("| --- | --- |" + " --- |" * len(KERNELS))
    for out, cols in SHAPES:
        weights = [gguf_like(out, cols) for _ in range(args.copies)]
        for rows in args.rows:
            x = torch.randn(rows, cols)
            cells = []
            for kernel in KERNELS.values():
                # dequantize-then-GEMM makes a float copy per call: a few copies are enough
                used = weights[:4] if kernel is DEQUANT else weights
                cells.append(f"{ms_per_call(kernel, x, used, clock):.3f}")
            print(f"| {out} x {cols} | {rows} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
