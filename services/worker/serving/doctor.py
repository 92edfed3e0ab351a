"""`layerserve doctor` (`python -m services.worker.serving.doctor`): report the device, NVIDIA
driver, CUDA runtime, torch and triton versions and the compute capability, and whether they fit
the worker's --device and --dtype. Starts nothing; exit status 0 when they fit, 1 when not."""

from __future__ import annotations

import argparse
import sys

from services.common.env import env_str
from services.worker.dtype_choice import resolve_dtype
from services.worker.kernels.platform import PlatformFacts, gather_facts
from services.worker.kernels.platform_check import check_platform, format_report, resolve_device


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="layerserve doctor",
        description="Check that this machine can run the worker, without starting anything.",
    )
    p.add_argument("--device", default=env_str("WORKER_DEVICE", "auto"), help="as the worker's")
    p.add_argument("--dtype", default=env_str("WORKER_DTYPE", "auto"), help="as the worker's")
    args = p.parse_args(argv)
    try:
        facts = gather_facts()
    except Exception as err:  # a broken CUDA install must still get a readable answer
        print(f"layerserve doctor: could not read the platform: {err}", file=sys.stderr)
        return 1
    try:
        dtype = _resolved_dtype(facts, args.device, args.dtype)
    except ValueError as err:
        print(f"layerserve doctor: {err}", file=sys.stderr)
        return 1
    problems = check_platform(facts, args.device, dtype)
    print(format_report(facts, args.device, dtype, problems))
    return 1 if problems else 0


def _resolved_dtype(facts: PlatformFacts, device: str, dtype: str) -> str:
    """--dtype as the worker would resolve it on `device` here ("auto" -> a dtype)."""
    import torch

    target = resolve_device(facts, device)
    if target == "cuda" and facts.capability is None:
        return "bfloat16" if dtype == "auto" else dtype  # no GPU to ask: check_platform says so
    if target not in ("cpu", "cuda"):
        return dtype  # check_platform names the bad --device
    return resolve_dtype(dtype, torch.device(target), capability=facts.capability).dtype


if __name__ == "__main__":
    sys.exit(main())
