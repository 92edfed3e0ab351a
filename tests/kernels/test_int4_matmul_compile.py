"""The int4 matmul kernel compiles for real GPUs (sm_80 and sm_90, fp16 and bf16) on any
machine: the interpreter (test_int4_matmul.py) runs its arithmetic but not the compiler's type
and layout rules. In a subprocess, as test_small_ops_compile.py explains."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# BLOCK_M as the host wrapper picks it for a decode step and for a prefill chunk.
VARIANTS = [{"BLOCK_M": 16, "BLOCK_N": 64}, {"BLOCK_M": 64, "BLOCK_N": 64}]


def compile_all() -> None:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from services.worker.kernels.int4_matmul_kernel import int4_matmul_kernel as fn

    for dtype in ("fp16", "bf16"):
        for constexprs in VARIANTS:
            signature = {arg: _arg_type(arg, dtype, constexprs) for arg in fn.arg_names}
            for capability in (80, 90):
                source = ASTSource(fn, signature, constexprs=constexprs)
                kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                assert kernel.asm["cubin"], (dtype, capability)
                print("compiled int4_matmul_kernel", dtype, f"sm_{capability}", constexprs)


def _arg_type(arg: str, dtype: str, constexprs: dict) -> str:
    if arg in constexprs:
        return "constexpr"
    if arg == "w_ptr":
        return "*u8"
    return f"*{dtype}" if arg.endswith("_ptr") else "i32"


def test_int4_matmul_compiles_for_sm80_and_sm90(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, not from an earlier cache
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.test_int4_matmul_compile"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("compiled ") == len(VARIANTS) * 2 * 2  # x dtypes x capabilities


if __name__ == "__main__":
    compile_all()
