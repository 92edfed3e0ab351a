"""Which weight format the worker computes with: --quantization, "auto" resolved at load.

"auto" keeps a GGUF file's 4-bit weights as the file stores them ("gguf", model/gguf_weights.py)
when the model runs on the CPU, in any compute dtype: a 4-bit kernel reads a quarter of
bfloat16's bytes and measured 2-4x the float weights' decode speed at batch 1 (under float32
compute the C++ op sums the file's values in float32, int4pack serves bfloat16;
docs/benchmarks.md, "Issue 29: 4-bit weights, served as they ship" and "the CPU default").
That is a llama file's Q4_0/Q4_1, and a Gemma 3 file's Q4_K with its Q5_0/Q8_0 (int8 under
float32 compute): 2.4x bfloat16 dense's speed and closer greedy text ("Issue 29: K-quants and
Q5_0 kept"). Anything else stays as loaded ("none"): a float
checkpoint (int8/int4 from floats cost quality the file's own 4-bit values do not), or a CUDA
device, where the Triton int4 kernel is not measured yet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

QUANTIZATION_CHOICES = ("auto", "none", "int8", "int4", "gguf")  # --quantization
# --activations: what a CPU's 4-bit (and Q8_0) kernels multiply the weights' values with, by the
# Int4Weight kernel each names (int4_weight.py, int8_activations.py); "auto": int4_kernel's choice.
ACTIVATION_KERNELS = {"float32": "q4_linear", "int16": "int16act", "int8": "int8act"}
ACTIVATION_CHOICES = ("auto", *ACTIVATION_KERNELS)
_KEPT_REASONS = {  # by the GGUF's general.architecture, where "auto" keeps its weights
    "llama": "auto: the file's Q4_0/Q4_1 weights kept 4-bit",
    "gemma3": "auto: the file's Q4_K weights kept 4-bit, Q5_0/Q8_0 as int8",
}


@dataclass(frozen=True, slots=True)
class QuantizationChoice:
    """The resolved --quantization and why (logged at load)."""

    method: str  # "none", "int8", "int4" or "gguf"
    reason: str


def resolve_quantization(
    choice: str, path: Path, device_type: str, dtype: str = "bfloat16"
) -> QuantizationChoice:
    """The method for --quantization `choice`, loading the model at `path` on a `device_type`
    ("cpu", "cuda") device to compute in `dtype` ("float32", "bfloat16", "float16")."""
    if choice not in QUANTIZATION_CHOICES:
        raise ValueError(
            f"--quantization must be one of {', '.join(QUANTIZATION_CHOICES)}, got {choice!r}"
        )
    if choice != "auto":
        return QuantizationChoice(choice, "--quantization")
    architecture = _auto_kept_architecture(path)
    if architecture is None:
        return QuantizationChoice("none", "auto: not a GGUF file with Q4_0/Q4_1 (or Gemma Q4_K)")
    if device_type != "cpu":
        return QuantizationChoice("none", f"auto: no measured 4-bit kernel on {device_type} yet")
    return QuantizationChoice("gguf", _KEPT_REASONS[architecture])


def activation_kernel(choice: str) -> str:
    """The Int4Weight kernel for --activations `choice` ("auto" for "auto")."""
    if choice not in ACTIVATION_CHOICES:
        raise ValueError(
            f"--activations must be one of {', '.join(ACTIVATION_CHOICES)}, got {choice!r}"
        )
    return ACTIVATION_KERNELS.get(choice, "auto")


def keeps_four_bit(choice: str, path: Path | None, device_type: str) -> bool:
    """Whether --quantization `choice` will keep the file at `path`'s 4-bit weights on a
    `device_type` device, whatever the compute dtype (dtype_choice.py asks, before the load)."""
    if path is None or choice not in ("auto", "gguf") or not file_has_four_bit(path):
        return False
    return choice == "gguf" or device_type == "cpu"


def file_has_four_bit(path: Path) -> bool:
    """Whether `path` is a GGUF file whose 4-bit weights "auto" keeps: a llama file's
    Q4_0/Q4_1, a Gemma 3 file's Q4_K (reads its header only)."""
    return _auto_kept_architecture(path) is not None


def _auto_kept_architecture(path: Path) -> str | None:
    """The GGUF file's architecture where "auto" keeps its weights, else None."""
    if path.suffix != ".gguf" or not path.is_file():
        return None
    from services.common.gguf_file import GGUFFile
    from services.worker.model.gguf_weights import auto_kept_architecture

    return auto_kept_architecture(GGUFFile(path))
