"""The number formats each side of the bench runs at (--precision, --dtype, --quantization,
--llama-cpp-type): `default` is what each ships as and a user gets without a flag
(layerserve's worker at its own --dtype and --quantization defaults for this machine, resolved
as the worker resolves them; llama.cpp on the GGUF file as packaged, Q4_1 for SmolLM2), and
`equal` runs both at the same precision (float32: layerserve computes in it, llama.cpp reads
the same weights from an F32 file it converts from the packaged one), and `equal-q4` both on the
packaged 4-bit file with 8-bit activations: llama.cpp's own dot products (Q4_1 weights times
activations quantized per 32 values, Q8_1), layerserve's `--activations int8` (the same
quantization of each row per 32 columns, summed exactly in int32). Each L2 row says which
pairing it belongs to and what each side ran at; ratios compare rows of one pairing only."""

from __future__ import annotations

from dataclasses import dataclass

import torch

PRECISIONS = ("default", "equal", "equal-q4")
DEFAULT_PRECISIONS = ("default", "equal")  # --precision unset
AS_SHIPPED = "as shipped"  # llama.cpp on the packaged GGUF, untouched
# llama.cpp file types the bench may convert the packaged GGUF to (llama_ftype values).
LLAMA_CPP_TYPES = {"F32": 0, "F16": 1, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3}
EQUAL_DTYPE = "float32"


@dataclass(frozen=True, slots=True)
class Precision:
    """One pairing: what layerserve computes in and what file llama.cpp reads."""

    name: str  # one of PRECISIONS
    dtype: str  # layerserve's compute dtype, resolved ("float32", "bfloat16", ...)
    quantization: str  # layerserve's --quantization ("none", "int8", ...)
    llama_cpp_type: str  # AS_SHIPPED or a key of LLAMA_CPP_TYPES
    reason: str  # why layerserve's dtype and weights are what they are
    activations: str = "auto"  # layerserve's --activations (quant_choice.ACTIVATION_CHOICES)

    def layerserve(self) -> str:
        """e.g. "bfloat16 + int8 weights", "float32" or "float32 + gguf weights, int8
        activations"."""
        q = "" if self.quantization == "none" else f" + {self.quantization} weights"
        a = "" if self.activations == "auto" else f", {self.activations} activations"
        return self.dtype + q + a

    def llama_cpp(self, shipped: str) -> str:
        """shipped: the packaged file's type, e.g. "Q4_1"."""
        if self.llama_cpp_type == AS_SHIPPED:
            return f"{shipped} ({AS_SHIPPED})"
        return f"{self.llama_cpp_type} (converted from the {shipped} file by llama.cpp)"

    def worker_args(self) -> list[str]:
        """The worker's flags for L3: the same formats as the L2 engine's."""
        args = ["--dtype", self.dtype, "--quantization", self.quantization]
        return args + ([] if self.activations == "auto" else ["--activations", self.activations])

    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)


def precisions(
    names: tuple[str, ...], dtype: str | None, quantization: str | None, llama_cpp_type: str
) -> tuple[Precision, ...]:
    """The pairings asked for. dtype, quantization: layerserve's side of `default` (None: the
    worker's own defaults, `auto` resolved for this CPU); llama_cpp_type: llama.cpp's side."""
    from services.worker.config import WorkerConfig
    from services.worker.dtype_choice import resolve_dtype
    from services.worker.model.loader import default_path
    from services.worker.model.quant_choice import (
        QUANTIZATION_CHOICES,
        keeps_four_bit,
        resolve_quantization,
    )

    if quantization is not None and quantization not in QUANTIZATION_CHOICES:
        raise ValueError(f"--quantization: {quantization!r} is not one of {QUANTIZATION_CHOICES}")
    worker = WorkerConfig.from_args([])  # its defaults, LAYERSERVE_WORKER_* as the worker reads
    quantization = quantization or worker.quantization
    four_bit = keeps_four_bit(quantization, default_path(), "cpu")
    choice = resolve_dtype(dtype or worker.dtype, torch.device("cpu"), four_bit_weights=four_bit)
    weights = resolve_quantization(quantization, default_path(), "cpu", choice.dtype)
    reason = f"{choice.reason}; {weights.reason}"
    made = {
        "default": Precision("default", choice.dtype, weights.method, llama_cpp_type, reason),
        "equal": Precision("equal", EQUAL_DTYPE, "none", "F32", "equal precision"),
        "equal-q4": Precision(
            "equal-q4", EQUAL_DTYPE, "gguf", AS_SHIPPED, "llama.cpp's formats", "int8"
        ),
    }
    return tuple(made[name] for name in names)


def load_layerserve(precision: Precision):
    """The packaged model on the CPU as the worker loads it at `precision`: LoadedModel."""
    from services.worker.model.loader import default_path, load_model
    from services.worker.model.quant import quantize_loaded
    from services.worker.model.quant_choice import activation_kernel

    loaded = load_model(default_path(), dtype=precision.torch_dtype(), device=torch.device("cpu"))
    kernel = activation_kernel(precision.activations)
    return quantize_loaded(loaded, precision.quantization, kernel)


def add_flags(parser) -> None:
    """--precision, --dtype, --quantization and --llama-cpp-type on an argparse parser."""
    parser.add_argument(
        "--precision",
        default=",".join(DEFAULT_PRECISIONS),
        help="default (each side as it ships: layerserve's worker defaults for this machine, "
        "llama.cpp on the packaged GGUF), equal (both float32: llama.cpp on an F32 file it "
        "converts from the packaged one) and/or equal-q4 (both on the packaged 4-bit file with "
        "8-bit activations per 32 values: llama.cpp's Q8_1, layerserve's --activations int8); "
        "layerserve and llama.cpp run once per pairing, L3's worker at the first",
    )
    parser.add_argument("--dtype", help="layerserve's dtype in `default` (the worker's default)")
    parser.add_argument(
        "--quantization", help="layerserve's --quantization in `default` (the worker's default)"
    )
    parser.add_argument(
        "--llama-cpp-type",
        default=AS_SHIPPED,
        choices=(AS_SHIPPED, *LLAMA_CPP_TYPES),
        help="llama.cpp's file in `default`: as shipped, or converted to this type",
    )


def from_flags(args) -> tuple[Precision, ...]:
    """The pairings the parsed flags ask for; ValueError names a wrong one."""
    names = tuple(dict.fromkeys(x.strip() for x in args.precision.split(",") if x.strip()))
    if not names or set(names) - set(PRECISIONS):
        raise ValueError(f"--precision: {args.precision!r} is not a list of {PRECISIONS}")
    return precisions(names, args.dtype, args.quantization, args.llama_cpp_type)
