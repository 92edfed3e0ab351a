"""Worker configuration: CLI flags over LAYERSERVE_WORKER_* environment variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from services.common.env import env_float, env_int, env_str
from services.common.metrics import add_metrics_port_flag, check_metrics_port
from services.common.serve import (
    DEFAULT_DRAIN_TIMEOUT_S,
    add_drain_timeout_flag,
    check_drain_timeout,
)

KERNEL_CHOICES = ("auto", "torch", "triton")  # --kernels; resolved in kernel_choice.py

# An engine step that has not returned after this long counts as hung: the worker reports
# NOT_SERVING until a step returns. Generous: a long prefill on a CPU takes seconds.
DEFAULT_STEP_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    host: str
    port: int
    model_path: str | None  # None: the embedded SmolLM2-135M-Instruct GGUF
    model_name: str
    device: str
    dtype: str
    block_size: int
    num_blocks: int | None
    kv_cache_gb: float
    max_model_len: int | None
    threads: int
    null: bool
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S  # on SIGTERM, for requests it holds
    metrics_port: int = 0  # Prometheus /metrics on --host; 0 = none
    kernels: str = "auto"  # attention and KV writes: auto (triton on CUDA), torch or triton

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size}")
        if self.kv_cache_gb <= 0:
            raise ValueError(f"--kv-cache-gb must be positive, got {self.kv_cache_gb}")
        if not self.step_timeout_s > 0:
            raise ValueError(f"--step-timeout-s must be positive, got {self.step_timeout_s}")
        check_drain_timeout(self.drain_timeout_s)
        check_metrics_port(self.metrics_port)
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"--kernels must be one of {KERNEL_CHOICES}, got {self.kernels!r}")

    @classmethod
    def from_args(cls, argv: list[str] | None = None) -> WorkerConfig:
        p = argparse.ArgumentParser(prog="python -m services.worker")
        p.add_argument("--host", default=env_str("WORKER_HOST", "127.0.0.1"))
        p.add_argument("--port", type=int, default=env_int("WORKER_PORT", 50061))
        p.add_argument(
            "--model-path",
            default=env_str("MODEL_PATH", "") or None,
            help="a .gguf file or a Llama checkpoint directory (default: SmolLM2-135M)",
        )
        p.add_argument("--model-name", default=env_str("MODEL_NAME", "smollm2-135m-instruct"))
        p.add_argument("--device", default=env_str("WORKER_DEVICE", "auto"))
        p.add_argument("--dtype", default=env_str("WORKER_DTYPE", "float32"))
        p.add_argument("--block-size", type=int, default=env_int("BLOCK_SIZE", 16))
        p.add_argument("--num-blocks", type=int, default=env_int("NUM_BLOCKS", 0) or None)
        p.add_argument("--kv-cache-gb", type=float, default=env_float("KV_CACHE_GB", 1.0))
        p.add_argument("--max-model-len", type=int, default=env_int("MAX_MODEL_LEN", 0) or None)
        p.add_argument(
            "--threads",
            type=int,
            default=env_int("WORKER_THREADS", 0),
            help="torch intra-op threads (0: torch's default)",
        )
        p.add_argument(
            "--null",
            action="store_true",
            help="no model: emit tokens from a fixed cycle (plumbing benchmarks)",
        )
        p.add_argument(
            "--step-timeout-s",
            type=float,
            default=env_float("STEP_TIMEOUT_S", DEFAULT_STEP_TIMEOUT_S),
            help="an engine step running longer is taken as hung: NOT_SERVING until one returns",
        )
        p.add_argument(
            "--kernels",
            choices=KERNEL_CHOICES,
            default=env_str("WORKER_KERNELS", "auto"),
            help="attention and KV cache writes: Triton kernels or torch ops (auto: Triton on "
            "CUDA, torch on the CPU; triton on the CPU needs TRITON_INTERPRET=1)",
        )
        add_drain_timeout_flag(p)
        add_metrics_port_flag(p)
        a = p.parse_args(argv)
        return cls(
            a.host,
            a.port,
            a.model_path,
            a.model_name,
            a.device,
            a.dtype,
            a.block_size,
            a.num_blocks,
            a.kv_cache_gb,
            a.max_model_len,
            a.threads,
            a.null,
            a.step_timeout_s,
            a.drain_timeout_s,
            a.metrics_port,
            a.kernels,
        )
