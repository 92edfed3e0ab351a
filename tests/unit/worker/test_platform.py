"""The platform check: which machines can run the worker as configured, and what the operator
is told when one cannot (`layerserve doctor`)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch
import triton

from services.worker.kernels.platform import PlatformFacts, gather_facts
from services.worker.kernels.platform_check import check_platform, format_report

H100 = PlatformFacts(
    torch_version="2.5.1+cu124",
    torch_cuda="12.4",
    triton_version="3.1.0",
    triton_pin="3.1.0",
    driver_version="550.54.15",
    driver_cuda="12.4",
    cuda_available=True,
    device_name="NVIDIA H100 80GB HBM3",
    capability=(9, 0),
)
CPU_ONLY = PlatformFacts(
    torch_version="2.5.1+cpu",
    torch_cuda=None,
    triton_version=None,
    triton_pin=None,
    driver_version=None,
    driver_cuda=None,
    cuda_available=False,
    device_name=None,
    capability=None,
)


def _with(facts: PlatformFacts, **changes: object) -> PlatformFacts:
    return dataclasses.replace(facts, **changes)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_a_matching_gpu_machine_has_no_problems(dtype: str) -> None:
    assert check_platform(H100, "auto", dtype) == []
    assert check_platform(H100, "cuda:0", dtype) == []
    assert "OK" in format_report(H100, "auto", dtype, [])


def test_a_cpu_machine_is_fine_in_cpu_mode() -> None:
    assert check_platform(CPU_ONLY, "auto", "float32") == []
    assert check_platform(CPU_ONLY, "cpu", "bfloat16") == []
    report = format_report(CPU_ONLY, "auto", "float32", [])
    assert "auto -> cpu" in report and "no CUDA" in report


def test_cuda_asked_of_a_cpu_only_torch() -> None:
    [problem] = check_platform(CPU_ONLY, "cuda", "float16")
    assert "torch 2.5.1+cpu is CPU-only" in problem
    with_driver = _with(CPU_ONLY, driver_version="550.54.15", driver_cuda="12.4")
    [problem] = check_platform(with_driver, "cuda", "float16")
    assert "550.54.15 supports CUDA 12.4" in problem


def test_driver_older_than_torchs_cuda_runtime() -> None:
    old = _with(H100, driver_version="535.104.05", driver_cuda="12.2", cuda_available=False)
    [problem] = check_platform(old, "cuda", "float16")
    for needed in ("535.104.05", "12.2", "2.5.1+cu124", "CUDA >= 12.4"):
        assert needed in problem
    # CUDA 12.10 is newer than 12.4: versions compare as numbers, not strings.
    newer = _with(H100, driver_cuda="12.10")
    assert check_platform(newer, "cuda", "float16") == []


def test_no_driver_at_all() -> None:
    gone = _with(H100, driver_version=None, driver_cuda=None, cuda_available=False)
    [problem] = check_platform(gone, "cuda", "float16")
    assert "needs an NVIDIA driver supporting CUDA >= 12.4" in problem


def test_driver_present_but_no_gpu_visible() -> None:
    hidden = _with(H100, cuda_available=False, device_name=None, capability=None)
    [problem] = check_platform(hidden, "cuda", "float16")
    assert "CUDA_VISIBLE_DEVICES" in problem
    # auto falls back to the CPU instead.
    assert check_platform(hidden, "auto", "float16") == []


def test_triton_other_than_torchs_pin() -> None:
    [problem] = check_platform(_with(H100, triton_version="3.0.0"), "cuda", "float16")
    assert "triton 3.0.0 is installed" in problem and "pip install triton==3.1.0" in problem
    [problem] = check_platform(_with(H100, triton_version=None), "cuda", "float16")
    assert "triton is not installed" in problem and "triton==3.1.0" in problem
    # A nightly's pytorch-triton carries a local version; the same release matches.
    nightly = _with(H100, triton_version="3.2.0+git4b3bb1f8", triton_pin="3.2.0+git4b3bb1f8")
    assert check_platform(nightly, "cuda", "float16") == []


def test_bfloat16_needs_ampere() -> None:
    turing = _with(H100, device_name="Tesla T4", capability=(7, 5))
    [problem] = check_platform(turing, "cuda", "bfloat16")
    assert "Tesla T4 has 7.5" in problem and "--dtype float16" in problem
    assert check_platform(turing, "cuda", "float16") == []
    assert check_platform(_with(H100, capability=(8, 0)), "cuda", "bfloat16") == []


def test_every_problem_is_reported_together() -> None:
    bad = _with(H100, driver_cuda="12.2", triton_version="3.0.0", capability=(7, 5))
    problems = check_platform(bad, "cuda", "bfloat16")
    assert len(problems) == 3
    report = format_report(bad, "cuda", "bfloat16", problems)
    assert report.count("PROBLEM:") == 3 and "OK" not in report


def test_unknown_device() -> None:
    assert check_platform(H100, "tpu", "float16") == [
        "--device must be auto, cpu or cuda[:N], got 'tpu'"
    ]


def test_facts_of_this_machine() -> None:
    facts = gather_facts()
    assert facts.torch_version == torch.__version__
    assert facts.torch_cuda == torch.version.cuda
    assert facts.triton_version is not None and facts.triton_version.startswith(triton.__version__)
    assert facts.cuda_available == torch.cuda.is_available()


def _doctor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.launcher", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a machine without CUDA")
def test_layerserve_doctor_on_a_machine_without_cuda() -> None:
    result = _doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "auto -> cpu" in result.stdout and "no CUDA" in result.stdout
    assert f"torch         {torch.__version__}" in result.stdout
    result = _doctor("--device", "cuda")
    assert result.returncode == 1
    assert "PROBLEM: --device cuda needs a CUDA build of torch" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
