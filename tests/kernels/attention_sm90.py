"""Compiles the attention kernels for Hopper (sm_90) without a GPU and reads what ptxas says:

    python -m tests.kernels.attention_sm90            # the variants the suite checks (fast)
    python -m tests.kernels.attention_sm90 --all      # every variant the worker can launch

The interpreter runs what the compiler may reject (a tl.dot below its minimum shape, a dtype
mix, shared memory over the limit), so the kernel tests on CPU alone would not catch those, nor
register spills. Triton compiles to a cubin ahead of time with its bundled ptxas and needs no
device; it drops ptxas's -v report, so ptxas runs once more on the kept PTX (a cache hit
compiles nothing and still gets its report). Run in a process without TRITON_INTERPRET (the
kernels must be JITFunctions, not interpreted ones).

Prints one markdown row per variant (registers, spill bytes, stack, shared memory) and exits 1
when any variant fails to compile, spills, or needs more shared memory than an H100/H200 block
may have."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from services.worker.kernels.attention_inputs import HEAD_DIMS, dot_precision
from services.worker.kernels.decode_attention import MAX_SPLITS, decode_tiles, group_pad
from services.worker.kernels.decode_attention_kernel import (
    decode_attention_kernel,
    decode_reduce_kernel,
)
from services.worker.kernels.platform_tensors import next_power_of_2
from services.worker.kernels.prefill_attention import prefill_tiles
from services.worker.kernels.prefill_attention_kernel import prefill_attention_kernel

HOPPER = GPUTarget("cuda", 90, 32)
CUDA = torch.device("cuda")  # only read by the tile choosers; no device is touched
# Shared memory one block may have on sm_90 (H100, H200): 227 KB (232,448 bytes).
SHARED_LIMIT = 227 * 1024
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
GROUPS = range(1, 9)  # query heads per KV head: MHA to Llama 3's 4 and beyond
# The worker takes any power-of-two --block-size; these span what anyone would set.
PAGE_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# Every SPLITS_PAD the reduction can be compiled with: num_splits 2..MAX_SPLITS, padded.
SPLITS_PADS = tuple(sorted({next_power_of_2(n) for n in range(2, MAX_SPLITS + 1)}))
FLOAT_ARGS = {"q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"}
FP32_ARGS = {"part_out_ptr", "part_lse_ptr", "qk_scale"}
# Arguments a real launch passes 16-aligned (torch's allocations; strides of [.., D] rows with
# D in HEAD_DIMS): the JIT specialises them as divisible by 16, and so does this compile.
_ALIGNED = re.compile(r"^(.*_ptr|stride_(q|k|v|o|p)\w*|tokens_per_split)$")


@dataclass(frozen=True, slots=True)
class Variant:
    """One compiled form of a kernel, as the host wrappers would launch it on CUDA."""

    kernel: str  # "decode", "reduce" or "prefill"
    dtype: str  # of q, the caches and out
    head_dim: int
    group: int = 1
    page_size: int = 16
    split: bool = False
    splits_pad: int = 0  # the reduction's

    def label(self) -> str:
        parts = [self.kernel, self.dtype, f"D={self.head_dim}"]
        if self.kernel == "reduce":
            parts.append(f"splits<={self.splits_pad}")
        else:
            parts += [f"G={self.group}", f"page={self.page_size}"]
        if self.kernel == "decode":
            parts.append("split" if self.split else "one split")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Build:
    variant: Variant
    tiles: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    shared: int = 0
    error: str = ""
    problems: list[str] = field(default_factory=list)

    def row(self) -> str:
        verdict = "; ".join(self.problems) if self.problems else "ok"
        cells = [
            self.variant.label(), self.tiles, str(self.registers),
            f"{self.spill_stores}/{self.spill_loads}", str(self.stack), str(self.shared), verdict,
        ]  # fmt: skip
        return "| " + " | ".join(cells) + " |"


HEADER = (
    "| variant | tiles | registers | spill stores/loads (bytes) | stack | shared (bytes) | "
    "verdict |\n| --- | --- | --- | --- | --- | --- | --- |"
)


def _launch(v: Variant) -> tuple[triton.JITFunction, dict, int, int, str]:
    """The kernel, its constexprs, num_warps and num_stages as the host wrapper picks them."""
    dtype = DTYPES[v.dtype]
    if v.kernel == "prefill":
        t = prefill_tiles(CUDA, v.head_dim, dtype)
        constants = dict(
            GROUP=v.group, HEAD_DIM=v.head_dim, PAGE_SIZE=v.page_size, BLOCK_M=t.block_m,
            BLOCK_N=t.block_n, DOT_PRECISION=dot_precision(dtype),
        )  # fmt: skip
        tiles = f"{t.block_m}x{t.block_n} w{t.num_warps} s{t.num_stages}"
        return prefill_attention_kernel, constants, t.num_warps, t.num_stages, tiles
    d = decode_tiles(CUDA, v.head_dim, dtype)
    if v.kernel == "reduce":
        constants = dict(HEAD_DIM=v.head_dim, SPLITS_PAD=v.splits_pad)
        return decode_reduce_kernel, constants, d.num_warps, 1, f"w{d.num_warps}"
    constants = dict(
        GROUP=v.group, GROUP_PAD=group_pad(v.group), HEAD_DIM=v.head_dim,
        PAGE_SIZE=v.page_size, BLOCK_N=d.block_n, SPLIT=v.split,
        DOT_PRECISION=dot_precision(dtype),
    )  # fmt: skip
    tiles = f"N={d.block_n} w{d.num_warps} s{d.num_stages}"
    return decode_attention_kernel, constants, d.num_warps, d.num_stages, tiles


def _signature(kernel: triton.JITFunction, dtype: str, constants: dict) -> dict[str, str]:
    """Types as the host wrappers pass them: the worker's int64 tables and lengths."""
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in FLOAT_ARGS:
            signature[name] = "*" + dtype
        elif name in FP32_ARGS:
            signature[name] = "*fp32" if name.endswith("_ptr") else "fp32"
        elif name.endswith("_ptr"):
            signature[name] = "*i64"
        else:
            signature[name] = "i32"
    return signature


def _aligned(kernel: triton.JITFunction, constants: dict) -> dict:
    return {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(kernel.arg_names)
        if name not in constants and _ALIGNED.match(name)
    }


_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill")


def _ptxas_report(ptx: str) -> tuple[int, int, int, int]:
    """(registers, stack bytes, spill store bytes, spill load bytes) by ptxas -v on the PTX,
    with the options Triton's own ptxas call uses."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "kernel.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        arch = sm_arch_from_capability(HOPPER.arch)
        cmd = [
            get_ptxas(HOPPER.arch).path, "-lineinfo", "-v", "--regAllocOptLevel=2",
            f"--gpu-name={arch}", src, "-o", os.path.join(tmp, "kernel.cubin"),
        ]  # fmt: skip
        log = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    used, spill = _PTXAS_USED.search(log), _PTXAS_SPILL.search(log)
    if used is None or spill is None:
        raise RuntimeError(f"ptxas -v printed no register report:\n{log}")
    return int(used[1]), int(spill[1]), int(spill[2]), int(spill[3])


def compile_variant(v: Variant) -> Build:
    kernel, constants, num_warps, num_stages, tiles = _launch(v)
    source = ASTSource(kernel, _signature(kernel, v.dtype, constants), constants,
                       _aligned(kernel, constants))  # fmt: skip
    options = {"num_warps": num_warps, "num_stages": num_stages}
    try:
        compiled = triton.compile(source, target=HOPPER, options=options)
        registers, stack, stores, loads = _ptxas_report(compiled.asm["ptx"])
    except Exception as err:  # the report names it; main() exits non-zero
        return Build(v, tiles, error=f"{type(err).__name__}: {str(err)[:300]}",
                     problems=["does not compile"])  # fmt: skip
    shared = compiled.metadata.shared
    problems = []
    if stores or loads:
        problems.append(f"spills {stores} B stored, {loads} B loaded")
    if shared > SHARED_LIMIT:
        problems.append(f"shared {shared} B > {SHARED_LIMIT} B")
    return Build(v, tiles, registers, stores, loads, stack, shared, problems=problems)


def variants(full: bool) -> list[Variant]:
    """Fast: every dtype, head dim and split mode at the default page size and a GQA group of
    3, and the largest reduction. Full (--all): also GQA groups 1-8, every page size, every
    reduction width. Registers and shared memory depend on the tiles, the dtype and the head
    dim; GROUP and PAGE_SIZE change only masks and index arithmetic, which the full sweep
    proves one axis at a time (group at the default page size, page size at group 1)."""
    out: list[Variant] = []
    for dtype in DTYPES:
        for head_dim in HEAD_DIMS:
            groups = GROUPS if full else (3,)
            shapes = {(g, 16) for g in groups}
            if full:
                shapes |= {(1, p) for p in PAGE_SIZES}
            for group, page in sorted(shapes):
                for split in (False, True):
                    out.append(Variant("decode", dtype, head_dim, group, page, split))
                out.append(Variant("prefill", dtype, head_dim, group, page))
            for pad in SPLITS_PADS if full else (MAX_SPLITS,):
                out.append(Variant("reduce", dtype, head_dim, splits_pad=pad))
    return out


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: the interpreter compiles nothing")
    parser = argparse.ArgumentParser(prog="python -m tests.kernels.attention_sm90")
    parser.add_argument("--all", action="store_true", help="every variant (slow)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    todo = variants(args.all)
    print(HEADER, flush=True)
    bad = 0
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for build in pool.map(compile_variant, todo):
            print(build.row(), flush=True)
            if build.error:
                print(f"  {build.error}", file=sys.stderr)
            bad += bool(build.problems)
    print(f"{len(todo)} variants for sm_90, {bad} with problems", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
