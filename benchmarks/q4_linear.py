"""The float32 4-bit linear op and the int16- and int8-activation ones against float32 dense and
what they replaced, per call and per decode step, on SmolLM2-135M's shapes; and the Q8_0 head.

    PYTHONPATH=. .venv/bin/python -m benchmarks.q4_linear [--threads 1] [--rows 1 16 64 1024]
        [--step-rows 1 4 8] [--head-rows 1 8 64]

torch.ops.layerserve.q4_linear (csrc/q4_matmul.cpp, Int4Weight's kernel for float32 rows at
every row count), q4_q16_linear and q4_q8_linear (csrc/q4_q8_matmul.cpp, kernels "int16act"
and "int8act": the rows quantized to int16 or int8 per 32 columns, int32 sums) against
F.linear on the same weight dequantized to float32 (what a float32 dense model runs) and
dequantize-then-GEMM (DequantMM: the float copy made per call, what Int4Weight ran above 256
rows before the op's decoded path), for the model's four 4-bit shapes: q/k/v's 576 x 576 and
192 x 576 pieces, gate/up's 1536 x 576 and down's 576 x 1536.
The weights are GGUF-like (float16 scales and offsets, as a Q4_1 file's); each call takes the
next of --copies copies and, up to 16 rows, a 64 MB buffer is written before each pass, so that
a call reads its weight from memory as a decode step does. The kernels take turns (A, B, C, A,
B, C, ...), in ms a call. With one thread, each cell is the median of --passes passes by this
thread's CPU time (fair on a loaded machine). With more, it is the 10th percentile of the calls'
wall times, each call timed alone: on a loaded machine a call is often stalled by a thread that
lost its core (ms for a µs call), and a median or a pass's mean measures that, not the kernel.
Prints a Markdown table.

Then, per --step-rows, one decode step's 4-bit linears as the model runs them (30 layers of
fused qkv 960 x 576, o 576 x 576, fused gate_up 3072 x 576 and down 576 x 1536: 120 calls, 53 MB
of weights read from memory) with each op (int16act twice on a CPU with AMX: the vector
kernel alone, and with AMX tiles from 4 rows, the default there): the median of --passes
steps, each step's total by this thread's CPU time with one thread, by wall clock with more.
(The per-call table above runs each op as the worker would: with tiles where there are.)

Then, per --head-rows, SmolLM2's Q8_0 head (49152 x 576, Q8_0Weight) with float32 activations
(q8_0_linear up to 32 rows, BLAS slices above), int16 and int8 (q8_0_q16_linear,
q8_0_q8_linear): the median of --passes calls, timed as the step."""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from services.worker.layers import cpu_attention_ext
from services.worker.layers.gguf_quant import GroupQuant
from services.worker.layers.int4_weight import DEQUANT, Q4_OP, Int4Weight, quantize_int4
from services.worker.layers.int8_activations import INT8ACT, INT16ACT, amx_tiles
from services.worker.layers.q8_0_weight import Q8_0Weight

SHAPES = ((576, 576), (192, 576), (1536, 576), (576, 1536))  # (out, in)
STEP_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))  # a layer's calls, fused
LAYERS = 30
COLD_ROWS = 16  # up to this many rows a call is bound by reading the weight: read it cold


Weights = tuple[Int4Weight, torch.Tensor, Int4Weight, Int4Weight]  # q4, dense, int8, int16act
HEAD = (49152, 576)


def gguf_like(out: int, cols: int, dense: bool = True) -> Weights:
    """A random float32 Int4Weight with float16-exact scales and offsets, as a Q4_1 file's,
    the same weight dense in float32 (empty unless `dense`) and as the int8act and int16act
    kernels'."""
    groups = quantize_int4(torch.randn(out, cols))
    scale, offset = groups.scale.half().float(), groups.offset.half().float()
    groups = GroupQuant(groups.q, scale, offset, bits=4)
    weights = groups.dequantized() if dense else torch.empty(0)
    int8act = Int4Weight(groups, torch.float32, kernel="int8act")
    int16act = Int4Weight(groups, torch.float32, kernel="int16act")
    return Int4Weight(groups, torch.float32, kernel="q4_linear"), weights, int8act, int16act


def kernels(x: torch.Tensor) -> dict[str, Callable[[Weights], object]]:
    return {
        "q4_linear": lambda w: Q4_OP(x, w[0]),
        "q4_q8_linear (int8act)": lambda w: INT8ACT(x, w[2]),
        "q4_q16_linear (int16act)": lambda w: INT16ACT(x, w[3]),
        "dense float32 F.linear": lambda w: F.linear(x, w[1]),
        "dequantize + GEMM": lambda w: DEQUANT(x, w[0]),
    }


def cell(times: list[float], one_thread: bool) -> float:
    """The median pass with one thread; the 10th percentile call with more."""
    if one_thread:
        return statistics.median(times)
    return sorted(times)[len(times) // 10]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.q4_linear")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8, 16, 64, 256])
    p.add_argument("--step-rows", type=int, nargs="*", default=[1, 4, 8])
    p.add_argument("--head-rows", type=int, nargs="*", default=[1, 8, 64])
    p.add_argument("--copies", type=int, default=16, help="weights cycled per shape")
    p.add_argument("--passes", type=int, default=5, help="interleaved passes per cell")
    args = p.parse_args()
    if not cpu_attention_ext.load():
        raise SystemExit("the C++ extension is not built: make install")
    torch.set_num_threads(args.threads)
    one = args.threads == 1
    clock = time.thread_time if one else time.perf_counter
    flush = torch.zeros(16 << 20)  # 64 MB, more than the L3
    how = "median pass, thread CPU time" if one else "10th percentile call, wall clock"
    print(f"threads {args.threads} ({how})")
    names = list(kernels(torch.empty(0)))
    ratios = " | int8act / q4_linear | int16act / q4_linear |"
    print("| shape (out x in) | rows | " + " | ".join(names) + ratios)
    print("| --- | --- |" + " --- |" * (len(names) + 2))
    for out, cols in SHAPES:
        weights = [gguf_like(out, cols) for _ in range(args.copies)]
        for rows in args.rows:
            x = torch.randn(rows, cols)
            # big calls: fewer copies, so that a pass stays short (the weights are cached by
            # then either way: the work is in the arithmetic)
            used = weights if rows <= COLD_ROWS else weights[: max(2, 4096 // (rows * 8))]
            times: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.passes):
                for name, kernel in kernels(x).items():
                    if rows <= COLD_ROWS:
                        flush.add_(1.0)
                    if one:
                        started = clock()
                        for pair in used:
                            kernel(pair)
                        times[name].append((clock() - started) / len(used) * 1e3)
                        continue
                    for pair in used:
                        started = clock()
                        kernel(pair)
                        times[name].append((clock() - started) * 1e3)
            ms = [cell(times[name], one) for name in names]
            cells = " | ".join(f"{m:.3f}" for m in ms)
            ratio = f"{ms[1] / ms[0]:.2f} | {ms[2] / ms[0]:.2f}"
            print(f"| {out} x {cols} | {rows} | {cells} | {ratio} |", flush=True)
    if args.step_rows:
        decode_steps(args.step_rows, args.passes, one, flush)
    if args.head_rows:
        head(args.head_rows, args.passes, one, flush)


def decode_steps(step_rows: list[int], passes: int, one: bool, flush: torch.Tensor) -> None:
    """One decode step's 120 4-bit linears with each op, per row count (see the docstring)."""
    # 30 distinct layers, so that a step reads its weights from memory as the model's does
    layers = [
        [gguf_like(out, cols, dense=False) for out, cols in STEP_SHAPES] for _ in range(LAYERS)
    ]
    clock = time.thread_time if one else time.perf_counter
    print()
    tiles = amx_tiles()
    print(
        "| decode step, 120 linears | rows | q4_linear ms | int8act ms | int16act ms "
        "| int16act, AMX tiles from 4 rows ms |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    # (kernel, index of its weight, AMX tiles on): the vector kernel alone, then with tiles
    ops = {
        "q4": (Q4_OP, 0, False),
        "int8act": (INT8ACT, 2, False),
        "int16act": (INT16ACT, 3, False),
        "int16act tiles": (INT16ACT, 3, True),
    }
    if not tiles:
        del ops["int16act tiles"]
    try:
        for rows in step_rows:
            inputs = {cols: torch.randn(rows, cols) for _, cols in STEP_SHAPES}
            times: dict[str, list[float]] = {name: [] for name in ops}
            for _ in range(passes):
                for name, (op, index, on) in ops.items():
                    amx_tiles(on)
                    flush.add_(1.0)
                    started = clock()
                    for layer in layers:
                        for (_, cols), weights in zip(STEP_SHAPES, layer, strict=True):
                            op(inputs[cols], weights[index])
                    times[name].append((clock() - started) * 1e3)
            cells = [f"{statistics.median(times[name]):.2f}" for name in ops]
            cells += [] if tiles else ["no AMX"]
            print(f"| {LAYERS} layers | {rows} | " + " | ".join(cells) + " |", flush=True)
    finally:
        amx_tiles(tiles)


def head(head_rows: list[int], passes: int, one: bool, flush: torch.Tensor) -> None:
    """SmolLM2's Q8_0 head with each kind of activations, per row count (see the docstring)."""
    out, cols = HEAD
    q = torch.randint(-127, 128, HEAD, dtype=torch.int8)
    scale = (torch.rand(out, cols // 32) * 0.01).half().float()
    groups = GroupQuant(q, scale, torch.zeros_like(scale), bits=8)
    kinds = ("float32", "int16", "int8")
    weights = {kind: Q8_0Weight(groups, activations=kind) for kind in kinds}
    clock = time.thread_time if one else time.perf_counter
    tiles = amx_tiles()
    runs = [(kind, kind, False) for kind in kinds] + ([("int16 tiles", "int16", True)] * tiles)
    print()
    print("| head 49152 x 576 | rows | float32 ms | int16 ms | int8 ms | int16, AMX tiles ms |")
    print("| --- | --- | --- | --- | --- | --- |")
    try:
        for rows in head_rows:
            x = torch.randn(rows, cols)
            times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
            for _ in range(passes):
                for name, kind, on in runs:
                    amx_tiles(on)
                    flush.add_(1.0)
                    started = clock()
                    F.linear(x, weights[kind])
                    times[name].append((clock() - started) * 1e3)
            cells = [f"{statistics.median(times[name]):.2f}" for name, _, _ in runs]
            cells += [] if tiles else ["no AMX"]
            print(f"| Q8_0 | {rows} | " + " | ".join(cells) + " |", flush=True)
    finally:
        amx_tiles(tiles)


if __name__ == "__main__":
    main()
