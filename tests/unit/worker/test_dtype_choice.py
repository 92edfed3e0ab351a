"""--dtype auto: bfloat16 on CUDA (float16 before compute capability 8.0) and on a CPU with
native bfloat16 (AVX512-BF16 or AMX), float32 on other CPUs; an explicit dtype always wins;
the worker's flag defaults to auto, and the doctor resolves it as the worker would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from services.worker.config import WorkerConfig
from services.worker.dtype_choice import cpu_flags, cpu_has_bf16, resolve_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_auto_on_a_cpu_follows_its_bfloat16_instructions() -> None:
    assert resolve_dtype("auto", CPU, cpu_bf16=True).dtype == "bfloat16"
    assert resolve_dtype("auto", CPU, cpu_bf16=False).dtype == "float32"
    assert "AVX512-BF16" in resolve_dtype("auto", CPU, cpu_bf16=True).reason


def test_auto_on_a_cpu_keeping_4_bit_weights_is_float32() -> None:
    # The matmuls are int4's either way; float32 for the rest stays closest to the reference.
    choice = resolve_dtype("auto", CPU, cpu_bf16=True, four_bit_weights=True)
    assert choice.dtype == "float32" and "4-bit weights" in choice.reason
    assert resolve_dtype("bfloat16", CPU, cpu_bf16=True, four_bit_weights=True).dtype == "bfloat16"
    assert resolve_dtype("auto", CUDA, capability=(9, 0), four_bit_weights=True).dtype == "bfloat16"


def test_auto_on_cuda_is_bfloat16_from_ampere_on() -> None:
    assert resolve_dtype("auto", CUDA, capability=(9, 0)).dtype == "bfloat16"
    assert resolve_dtype("auto", CUDA, capability=(8, 0)).dtype == "bfloat16"
    assert resolve_dtype("auto", CUDA, capability=(7, 5)).dtype == "float16"


def test_an_explicit_dtype_wins_and_a_wrong_one_is_refused() -> None:
    for dtype in ("float32", "bfloat16", "float16"):
        assert resolve_dtype(dtype, CPU, cpu_bf16=True).dtype == dtype
        assert resolve_dtype(dtype, CUDA, capability=(9, 0)).dtype == dtype
    with pytest.raises(ValueError, match="--dtype must be one of auto"):
        resolve_dtype("fp8", CPU)


def test_cpu_flags_read_from_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx512f avx512_bf16\n\nflags : other\n")
    assert cpu_flags(info) == {"fpu", "sse", "avx512f", "avx512_bf16"}
    assert cpu_flags(tmp_path / "missing") == frozenset()


def test_this_machine_agrees_with_its_flags() -> None:
    flags = cpu_flags()
    if flags:  # Linux: torch's probe and the kernel's flags tell the same story
        assert cpu_has_bf16() == bool(flags & {"avx512_bf16", "amx_bf16"})


def test_the_worker_flag_defaults_to_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAYERSERVE_WORKER_DTYPE", raising=False)
    assert WorkerConfig.from_args([]).dtype == "auto"
    assert WorkerConfig.from_args(["--dtype", "float32"]).dtype == "float32"
    monkeypatch.setenv("LAYERSERVE_WORKER_DTYPE", "bfloat16")
    assert WorkerConfig.from_args([]).dtype == "bfloat16"
    with pytest.raises(SystemExit):
        WorkerConfig.from_args(["--dtype", "fp8"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the report of a machine without CUDA")
def test_the_doctor_reports_what_auto_means_here() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "services.worker.serving.doctor"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    want = "bfloat16" if cpu_has_bf16() else "float32"
    assert f"auto -> cpu, dtype {want}" in result.stdout, result.stdout + result.stderr
