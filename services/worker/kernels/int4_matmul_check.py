"""The 4-bit weight kernels on a device: correctness against the dequantized reference and
time against the dtype's GEMM on the float weight, as markdown tables (what scripts/gpu_check.py
keeps from a section's stdout).

    python -m services.worker.kernels.int4_matmul_check [--dry-run]

On CUDA: the Triton int4 matmul (kernels/int4_matmul.py, what an Int4Weight runs there up to
16 rows) at 1, 16 and 64 rows on SmolLM2's and a 7B model's projection shapes, in bfloat16,
beside cuBLAS on the dequantized weight. --dry-run: the same cases, small, on the CPU through
the Triton interpreter (correctness only)."""

from __future__ import annotations

import argparse
import os
import time

# Projection shapes [out, in]: SmolLM2-135M's gate_up and down, a 7B model's gate_up.
SHAPES = [(3072, 576), (576, 1536), (22016, 4096)]
DRY_SHAPES = [(96, 64), (64, 96)]
ROWS = (1, 16, 64)


def int4_rows(device: str, shapes: list[tuple[int, int]], reps: int) -> list[dict[str, object]]:
    """One row per (shape, rows): max |error| of the Triton kernel against the dequantized
    reference (relative to its max), and its time against F.linear on the dequantized weight
    (median of `reps`; 0 reps: correctness only). Random 4-bit values, Q4_1-like groups."""
    import torch
    import torch.nn.functional as F

    from services.worker.kernels.int4_matmul import GROUP_SIZE, int4_matmul, int4_matmul_ref

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    rows_out = []
    for n, k in shapes:
        nibbles = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
        scale = torch.rand(n, k // GROUP_SIZE, device=device) * 0.02
        offset = -8 * scale + torch.randn(n, k // GROUP_SIZE, device=device) * 0.01
        parts = (nibbles, scale.to(dtype), offset.to(dtype))
        dense = int4_matmul_ref(torch.eye(k, device=device, dtype=dtype), *parts).T.contiguous()
        for rows in ROWS:
            x = torch.randn(rows, k, device=device, dtype=dtype)
            expected = int4_matmul_ref(x, *parts).float()
            scale_of = expected.abs().max().item() or 1.0
            row: dict[str, object] = {"shape": f"{n}x{k}", "rows": rows}
            row["triton rel err"] = _err(int4_matmul(x, *parts), expected, scale_of)
            if reps:
                row["triton us"] = _time(int4_matmul, (x, *parts), reps, device)
                row["dense us"] = _time(F.linear, (x, dense), reps, device)
            rows_out.append(row)
    return rows_out


def _err(got, expected, scale: float) -> str:
    return f"{(got.float() - expected).abs().max().item() / scale:.1e}"


def _time(fn, args: tuple, reps: int, device: str) -> str:
    import torch

    fn(*args)
    times = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        fn(*args)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    return f"{sorted(times)[reps // 2] * 1e6:.1f}"


def markdown(rows: list[dict[str, object]]) -> str:
    """A markdown table of int4_rows' rows."""
    if not rows:
        return ""
    names = list(rows[0])
    lines = ["| " + " | ".join(names) + " |", "|" + " --- |" * len(names)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in names) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.worker.kernels.int4_matmul_check")
    parser.add_argument("--dry-run", action="store_true", help="CPU, Triton interpreter")
    parser.add_argument("--reps", type=int, default=20, help="timings per figure (median)")
    args = parser.parse_args(argv)
    if args.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is imported
        print(markdown(int4_rows("cpu", DRY_SHAPES, reps=0)), flush=True)
        return
    print(markdown(int4_rows("cuda", SHAPES, args.reps)), flush=True)


if __name__ == "__main__":
    main()
