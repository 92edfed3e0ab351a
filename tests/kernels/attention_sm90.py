"""Compiles the attention kernels for Hopper (sm_90) without a GPU:

    python -m tests.kernels.attention_sm90

The interpreter runs what the compiler may reject (a tl.dot below its minimum shape, a dtype
mix, shared memory over the limit), so the kernel tests on CPU alone would not catch those.
Triton compiles to a cubin ahead of time with its bundled ptxas and needs no device. Run in a
process without TRITON_INTERPRET (the kernels must be JITFunctions, not interpreted ones).
Prints one line per variant; exits non-zero on the first that fails to compile."""

from __future__ import annotations

import os

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from services.worker.kernels.attention_inputs import HEAD_DIMS
from services.worker.kernels.decode_attention import decode_attention_kernel, decode_reduce_kernel
from services.worker.kernels.decode_attention_host import MAX_SPLITS, decode_tiles
from services.worker.kernels.prefill_attention import prefill_attention_kernel
from services.worker.kernels.prefill_attention_host import prefill_tiles

HOPPER = GPUTarget("cuda", 90, 32)
CUDA = torch.device("cuda")  # only read by the tile choosers; no device is touched
FLOAT_TYPES = {"q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"}
FP32_TYPES = {"part_out_ptr", "part_lse_ptr", "qk_scale"}


def _signature(kernel: triton.JITFunction, dtype: str, constants: dict) -> dict[str, str]:
    """Types as the host wrappers pass them: the worker's int64 tables and lengths."""
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in FLOAT_TYPES:
            signature[name] = "*" + dtype
        elif name in FP32_TYPES:
            signature[name] = "*fp32" if name.endswith("_ptr") else "fp32"
        elif name.endswith("_ptr"):
            signature[name] = "*i64"
        else:
            signature[name] = "i32"
    return signature


def _compile(kernel: triton.JITFunction, dtype: str, constants: dict, num_warps: int) -> None:
    source = ASTSource(kernel, _signature(kernel, dtype, constants), constants)
    compiled = triton.compile(source, target=HOPPER, options={"num_warps": num_warps})
    print(f"{kernel.__name__} {dtype} {constants} shared={compiled.metadata.shared}")


def main() -> None:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("run without TRITON_INTERPRET=1: the interpreter compiles nothing")
    dtype = "bf16"
    for head_dim in HEAD_DIMS:
        decode = decode_tiles(CUDA, head_dim)
        for split in (False, True):
            constants = dict(
                GROUP=3, GROUP_PAD=16, HEAD_DIM=head_dim, PAGE_SIZE=16,
                BLOCK_N=decode.block_n, SPLIT=split, DOT_PRECISION="tf32",
            )  # fmt: skip
            _compile(decode_attention_kernel, dtype, constants, decode.num_warps)
        reduce_constants = dict(HEAD_DIM=head_dim, SPLITS_PAD=MAX_SPLITS)
        _compile(decode_reduce_kernel, dtype, reduce_constants, decode.num_warps)
        prefill = prefill_tiles(CUDA, head_dim)
        constants = dict(
            GROUP=3, HEAD_DIM=head_dim, PAGE_SIZE=16, BLOCK_M=prefill.block_m,
            BLOCK_N=prefill.block_n, DOT_PRECISION="tf32",
        )  # fmt: skip
        _compile(prefill_attention_kernel, dtype, constants, prefill.num_warps)


if __name__ == "__main__":
    main()
