"""Which weight format the worker computes with: --quantization, "auto" resolved at load.

"auto" keeps a GGUF file's 4-bit weights as the file stores them ("gguf", model/gguf_weights.py)
when the model runs on the CPU: torch's int4 kernel reads a quarter of float32's bytes and
measured faster than the float weights at 1 and 16 rows (docs/benchmarks.md, "4-bit
weights"). Anything else stays as loaded ("none"): a float checkpoint (int8/int4 from floats
cost quality the file's own 4-bit values do not), or a CUDA device, where no 4-bit kernel of
ours runs yet and the dequantize-per-call fallback would be slower than the float weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4", "gguf")  # --quantization


@dataclass(frozen=True, slots=True)
class QuantizationChoice:
    """The resolved --quantization and why (logged at load)."""

    method: str  # "none", "int8", "int4" or "gguf"
    reason: str


def resolve_quantization(choice: str, path: Path, device_type: str) -> QuantizationChoice:
    """The method for --quantization `choice`, loading the model at `path` on a `device_type`
    ("cpu", "cuda") device."""
    if choice not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"--quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, got {choice!r}"
        )
    if choice != "auto":
        return QuantizationChoice(choice, "--quantization")
    if path.suffix != ".gguf" or not path.is_file():
        return QuantizationChoice("none", "auto: not a GGUF file, weights as loaded")
    from services.common.gguf_file import GGUFFile
    from services.worker.model.gguf_weights import has_four_bit

    if not has_four_bit(GGUFFile(path)):
        return QuantizationChoice("none", "auto: no Q4_0/Q4_1 tensors in the file")
    if device_type != "cpu":
        return QuantizationChoice("none", f"auto: no 4-bit kernel on {device_type} yet")
    return QuantizationChoice("gguf", "auto: the file's Q4_0/Q4_1 weights kept 4-bit (int4pack)")
