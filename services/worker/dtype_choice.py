"""Which dtype the worker computes in (weights, activations and the KV cache): --dtype.

"auto" picks the device's fastest dtype that keeps the model's quality (docs/benchmarks.md,
"Issue 18", has the cost): bfloat16 on a CUDA device of compute capability >= 8.0 (float16
below: no bfloat16 tensor cores there, and Triton refuses it) and on a CPU with native bfloat16
dot products (AVX512-BF16 or AMX), where its GEMMs run 2x float32's; float32 on any other CPU,
where torch emulates bfloat16 GEMMs and they run slower than float32's. On a CPU serving a
GGUF's 4-bit weights as they ship (quant_choice.py), float32 everywhere: the matmuls are int4's
either way, and a float32 residual stream, norms and KV keep greedy output closest to the float
reference (24 prompts x 32 tokens: 17 exact against 11 in bfloat16) at about the same speed
(docs/benchmarks.md, "Issue 29: the CPU default"). For Gemma 3's Q4_K_M file float32 also lets
its Q5_0/Q8_0 weights and tied head stay int8 (a float32-only op): 2.4x bfloat16 dense's batch-1
decode, 20 of 24 exact against 13 ("Issue 29: K-quants and Q5_0 kept")."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported by the worker's config, which must not pull in torch
    import torch

DTYPE_CHOICES = ("auto", "float32", "bfloat16", "float16")  # --dtype
BF16_MIN_CAPABILITY = (8, 0)  # Ampere: bfloat16 tensor cores
# /proc/cpuinfo flags of an x86 CPU with bfloat16 dot-product instructions.
CPU_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    """The resolved --dtype and why (logged at start-up)."""

    dtype: str  # "float32", "bfloat16" or "float16"
    reason: str


def resolve_dtype(
    choice: str,
    device: torch.device,
    cpu_bf16: bool | None = None,
    capability: tuple[int, int] | None = None,
    four_bit_weights: bool = False,
) -> DtypeChoice:
    """The dtype for --dtype `choice` on `device`. cpu_bf16 and capability stand for what this
    machine has (None: read them here); tests pass them. four_bit_weights: the model's weights
    stay 4-bit (quant_choice.keeps_four_bit)."""
    if choice not in DTYPE_CHOICES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, got {choice!r}")
    if choice != "auto":
        return DtypeChoice(choice, "--dtype")
    if device.type == "cuda":
        if capability is None:
            import torch

            capability = tuple(torch.cuda.get_device_capability(device))
        cc = ".".join(map(str, capability))
        if capability >= BF16_MIN_CAPABILITY:
            return DtypeChoice("bfloat16", f"auto: CUDA compute capability {cc}")
        return DtypeChoice("float16", f"auto: CUDA compute capability {cc} < 8.0 (no bfloat16)")
    if device.type != "cpu":
        return DtypeChoice("float32", f"auto: {device.type} device")
    if four_bit_weights:
        return DtypeChoice("float32", "auto: 4-bit weights on the CPU; float32 for the rest")
    if cpu_bf16 is None:
        cpu_bf16 = cpu_has_bf16()
    if cpu_bf16:
        return DtypeChoice("bfloat16", "auto: the CPU has AVX512-BF16 or AMX")
    return DtypeChoice("float32", "auto: the CPU has no native bfloat16 (AVX512-BF16 or AMX)")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 dot products natively (AVX512-BF16 or AMX)."""
    import torch

    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    if any(getattr(torch.cpu, name, lambda: False)() for name in probes):
        return True
    return bool(cpu_flags() & CPU_BF16_FLAGS)  # a torch without the probes


def cpu_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The first CPU's feature flags from /proc/cpuinfo; empty where there is none (macOS)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()
