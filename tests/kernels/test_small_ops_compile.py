"""The small-op kernels compile for real GPUs (sm_80 and sm_90, fp16 and bf16) on any machine:
Triton's compiler and ptxas need no device. The interpreter runs the kernels' arithmetic but
not the compiler's type and layout rules, so without a GPU this is the only check of those.

Runs in a subprocess: a kernel is compiled only if it was decorated outside the interpreter,
which this test process may have switched on (tests/kernels/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# Constexprs as the host wrappers choose them for SmolLM2 (D=64) and Llama 3 (D=128).
KERNELS = {
    "rms_norm_kernel": [
        {"HAS_RESIDUAL": False, "BLOCK_D": 1024},
        {"HAS_RESIDUAL": True, "BLOCK_D": 4096},
    ],
    "silu_mul_kernel": [{"BLOCK_I": 1024}],
    "rope_kernel": [
        {"HALF": 32, "BLOCK_HALF": 32, "BLOCK_H": 16},
        {"HALF": 64, "BLOCK_HALF": 64, "BLOCK_H": 16},
    ],
    "cache_write_kernel": [{"BLOCK_H": 4, "BLOCK_D": 64}, {"BLOCK_H": 8, "BLOCK_D": 128}],
}


def compile_all() -> None:
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for name, variants in KERNELS.items():
        module = importlib.import_module(
            f"services.worker.kernels.{name.removesuffix('_kernel')}_kernel"
        )
        fn = getattr(module, name)
        for dtype in ("fp16", "bf16"):
            for constexprs in variants:
                signature = {arg: _arg_type(arg, dtype, constexprs) for arg in fn.arg_names}
                for capability in (80, 90):
                    source = ASTSource(fn, signature, constexprs=constexprs)
                    kernel = triton.compile(source, target=GPUTarget("cuda", capability, 32))
                    assert kernel.asm["cubin"], (name, dtype, capability)
                    print("compiled", name, dtype, f"sm_{capability}", constexprs)


def _arg_type(arg: str, dtype: str, constexprs: dict) -> str:
    if arg in constexprs:
        return "constexpr"
    if arg in ("slot_mapping_ptr", "positions_ptr"):
        return "*i64"
    if arg in ("cos_ptr", "sin_ptr"):
        return "*fp32"
    if arg.endswith("_ptr"):
        return f"*{dtype}"
    return "fp32" if arg == "eps" else "i32"


def test_kernels_compile_for_sm80_and_sm90(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real, not from an earlier cache
    result = subprocess.run(
        [sys.executable, "-m", "tests.kernels.test_small_ops_compile"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    variants = sum(len(v) for v in KERNELS.values())
    assert result.stdout.count("compiled ") == variants * 2 * 2  # x dtypes x capabilities


if __name__ == "__main__":
    compile_all()
