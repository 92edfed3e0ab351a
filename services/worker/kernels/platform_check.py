"""Whether the facts of this machine (platform.py) fit together for the worker's device and
dtype, said in words an operator can act on: the versions found and the versions needed.

check_platform is pure, so every mismatch can be tested on any machine by feeding it facts."""

from __future__ import annotations

from services.worker.kernels.platform import PlatformFacts, gather_facts

BF16_MIN_CAPABILITY = (8, 0)  # bfloat16 arithmetic arrived with Ampere (sm_80)


class PlatformMismatch(ValueError):
    """The machine cannot run the worker as configured; the message says what to change."""


def resolve_device(facts: PlatformFacts, device: str) -> str:
    """ "cpu" or "cuda": what --device means on this machine ("auto": CUDA when torch sees one)."""
    if device == "auto":
        return "cuda" if facts.cuda_available else "cpu"
    return "cuda" if device.startswith("cuda") else device


def check_platform(facts: PlatformFacts, device: str = "auto", dtype: str = "float32") -> list[str]:
    """Every reason the worker cannot run on `device` in `dtype` here; empty when it can."""
    if device != "auto" and device != "cpu" and not device.startswith("cuda"):
        return [f"--device must be auto, cpu or cuda[:N], got {device!r}"]
    if resolve_device(facts, device) == "cpu":
        return []
    problems = _cuda_problems(facts, device)
    if facts.torch_cuda is None:
        return problems  # a CPU build pins no triton: the other checks have nothing to go on
    problems += _triton_problems(facts)
    if dtype == "bfloat16" and facts.capability is not None:
        if facts.capability < BF16_MIN_CAPABILITY:
            problems.append(
                f"--dtype bfloat16 needs compute capability >= 8.0, but {facts.device_name} "
                f"has {_capability(facts)}: use --dtype float16"
            )
    return problems


def require_platform(device: str, dtype: str) -> PlatformFacts:
    """The facts, or PlatformMismatch naming every problem (for a worker about to start)."""
    facts = gather_facts()
    problems = check_platform(facts, device, dtype)
    if problems:
        raise PlatformMismatch("; ".join(problems))
    return facts


def format_report(facts: PlatformFacts, device: str, dtype: str, problems: list[str]) -> str:
    """The doctor's report: one fact per line, then the verdict."""
    target = resolve_device(facts, device)
    driver = facts.driver_version or "not found"
    driver += (
        f", supports CUDA up to {facts.driver_cuda}" if facts.driver_cuda else ", no libcuda.so.1"
    )
    lines = [
        f"device        {device} -> {target}, dtype {dtype}",
        f"GPU           {facts.device_name or 'none visible to torch'}",
        f"capability    {_capability(facts)}",
        f"NVIDIA driver {driver}",
        f"CUDA runtime  {facts.torch_cuda or 'none: torch is a CPU-only build'}",
        f"torch         {facts.torch_version}",
        f"triton        {facts.triton_version or 'not installed'} "
        f"(torch pins {facts.triton_pin or 'none'})",
    ]
    if problems:
        lines += [f"PROBLEM: {problem}" for problem in problems]
    elif target == "cpu":
        lines.append(
            "OK: no CUDA in use; the worker runs torch ops on the CPU (Triton kernels off)"
        )
    else:
        lines.append("OK: the GPU, driver, CUDA runtime, torch and triton fit together")
    return "\n".join(lines)


def _cuda_problems(facts: PlatformFacts, device: str) -> list[str]:
    torch_v, runtime, driver_cuda = facts.torch_version, facts.torch_cuda, facts.driver_cuda
    driver = f"NVIDIA driver {facts.driver_version or '(version unknown)'}"
    if runtime is None:
        hint = f"; the {driver} supports CUDA {driver_cuda}" if driver_cuda else ""
        return [
            f"--device {device} needs a CUDA build of torch, but torch {torch_v} is CPU-only{hint}"
        ]
    if driver_cuda is None:
        return [
            f"torch {torch_v} needs an NVIDIA driver supporting CUDA >= {runtime}, but none was "
            "found (libcuda.so.1 did not load)"
        ]
    if _version(driver_cuda) < _version(runtime):
        return [
            f"the {driver} supports CUDA up to {driver_cuda}, but torch {torch_v} was built for "
            f"CUDA {runtime}: install a driver supporting CUDA >= {runtime}, or a torch built "
            f"for CUDA <= {driver_cuda}"
        ]
    if not facts.cuda_available:
        return [
            f"torch {torch_v} (CUDA {runtime}) sees no GPU although the {driver} (CUDA "
            f"{driver_cuda}) is present: check CUDA_VISIBLE_DEVICES and the container's GPU access"
        ]
    return []


def _triton_problems(facts: PlatformFacts) -> list[str]:
    pin, installed = facts.triton_pin, facts.triton_version
    if installed is None:
        wanted = f"triton=={pin}" if pin else "triton"
        return [f"triton is not installed; torch {facts.torch_version} needs {wanted}"]
    if pin is not None and _base(installed) != _base(pin):
        return [
            f"triton {installed} is installed, but torch {facts.torch_version} was released "
            f"with triton {pin}: pip install triton=={pin}"
        ]
    return []


def _capability(facts: PlatformFacts) -> str:
    return "n/a" if facts.capability is None else "{}.{}".format(*facts.capability)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in _base(text).split(".") if part.isdigit())


def _base(version: str) -> str:
    """Without the local part: pytorch-triton's "3.2.0+git4b3bb1f8" is triton 3.2.0."""
    return version.split("+", 1)[0]
