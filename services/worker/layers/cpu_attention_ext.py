"""The C++ CPU attention extension (csrc/: cpu_attention.cpp with avx512_sums.h, avx512_bf16.h,
avx512_int8.h and vec_exp.h, rope.cpp, small_ops.cpp, q8_0_matmul.cpp, q4_matmul.cpp,
q4_q8_matmul.cpp, q8_0_q8_matmul.cpp, kv_write.cpp, llama_layers.cpp, sampling_ops.cpp): built
once by `make install` (python -m services.worker.layers.cpu_attention_ext) with torch's
extension tooling, loaded by the worker at start-up as torch.ops.layerserve.paged_attention,
rope_, silu_mul, q8_0_linear, q4_linear, q4_q8_linear, q8_0_q8_linear, write_kv_,
llama_layers and top_candidates (the sampler's).

It is compiled for the machine that builds it (-march=native), so the build directory is keyed
by the source, the flags, torch's version and this CPU's instruction sets: a changed source or a
build copied from another CPU is simply not found, and the worker falls back to the torch path
(attention.py logs a warning) instead of failing or running illegal instructions. For the same
reason the AVX512-BF16 scores (avx512_bf16.h) are chosen when compiling, not at run time: a CPU
without them builds the widening path alone (torch.ops.layerserve.has_avx512_bf16() says which)."""

from __future__ import annotations

import argparse
import functools
import hashlib
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import torch

NAME = "layerserve_cpu_attention"
SOURCE = Path(__file__).parent / "csrc" / "cpu_attention.cpp"
# One library: paged_attention, rope_, silu_mul, q8_0_linear, q4_linear, q4_q8_linear,
# q8_0_q8_linear, write_kv_, llama_layers (which calls the others) and top_candidates.
SOURCES = (
    SOURCE,
    SOURCE.with_name("rope.cpp"),
    SOURCE.with_name("small_ops.cpp"),
    SOURCE.with_name("q8_0_matmul.cpp"),
    SOURCE.with_name("q4_matmul.cpp"),
    SOURCE.with_name("q4_q8_matmul.cpp"),
    SOURCE.with_name("q8_0_q8_matmul.cpp"),
    SOURCE.with_name("kv_write.cpp"),
    SOURCE.with_name("llama_layers.cpp"),
    SOURCE.with_name("sampling_ops.cpp"),
)
HEADERS = (
    SOURCE.with_name("vec_exp.h"),
    SOURCE.with_name("avx512_sums.h"),
    SOURCE.with_name("avx512_bf16.h"),
    SOURCE.with_name("avx512_int8.h"),
    SOURCE.with_name("avx2_int8.h"),
    SOURCE.with_name("int_activations.h"),
    SOURCE.with_name("layer_ops.h"),
)  # not compiled alone, but part of the build's key
BUILD_ROOT = Path(__file__).resolve().parents[3] / "build" / "cpu_attention"  # .gitignore'd
# -fno-math-errno lets std::floor and friends vectorise; no -ffast-math: the kernel's
# reductions are written to vectorise without reassociation, and it must keep IEEE semantics.
CFLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fno-trapping-math")
LDFLAGS = ("-fopenmp",)


def library_path() -> Path:
    """Where this source, built on this CPU with this torch, lives."""
    key = hashlib.sha256()
    sources = [source.read_bytes() for source in (*SOURCES, *HEADERS)]
    for part in (*sources, " ".join(CFLAGS).encode(), torch.__version__.encode(),
                 platform.machine().encode(), _cpu_flags().encode()):  # fmt: skip
        key.update(part)
    return BUILD_ROOT / key.hexdigest()[:16] / f"{NAME}.so"


def build(verbose: bool = False) -> Path:
    """Compiles the extension unless this exact build exists; returns the library's path."""
    path = library_path()
    if path.exists():
        return path
    from torch.utils import cpp_extension

    path.parent.mkdir(parents=True, exist_ok=True)
    # The venv's ninja (a dependency) when the venv is not on PATH, as under `make`.
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    cpp_extension.load(
        name=NAME,
        sources=[str(s) for s in SOURCES],
        extra_cflags=list(CFLAGS),
        extra_ldflags=list(LDFLAGS),
        build_directory=str(path.parent),
        is_python_module=False,
        verbose=verbose,
    )
    for stale in BUILD_ROOT.iterdir():  # earlier sources' builds: never loaded again
        if stale != path.parent and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    return path


@functools.cache
def load() -> bool:
    """Registers torch.ops.layerserve.paged_attention if the extension is built; False if not
    (or when the source is not there to key the build by, as in a non-editable install)."""
    if not all(s.is_file() for s in (*SOURCES, *HEADERS)):
        return False
    path = library_path()
    if not path.exists():
        return False
    torch.ops.load_library(str(path))
    return True


def _cpu_flags() -> str:
    """This CPU's instruction-set flags (what -march=native compiled for), or "" if unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the C++ CPU attention extension.")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args()
    started = time.perf_counter()
    existed = library_path().exists()
    path = build(verbose=args.verbose)
    took = "already built" if existed else f"built in {time.perf_counter() - started:.0f} s"
    print(f"CPU attention extension: {path} ({took})")


if __name__ == "__main__":
    main()
