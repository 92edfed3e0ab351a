"""Worker configuration: CLI flags over LAYERSERVE_WORKER_* environment variables."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from services.common.env import env_float, env_int, env_str
from services.common.metrics import add_metrics_port_flag, check_metrics_port
from services.common.serve import (
    DEFAULT_DRAIN_TIMEOUT_S,
    add_drain_timeout_flag,
    check_drain_timeout,
)
from services.worker.kernel_choice import KERNEL_CHOICES

QUANTIZATION_CHOICES = ("none", "int8")  # --quantization; model/quant.py does it

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
    kv_cache_gb: float | None  # None: 1 GiB on the CPU, a share of the free memory on CUDA
    max_model_len: int | None
    threads: int
    null: bool
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S  # on SIGTERM, for requests it holds
    metrics_port: int = 0  # Prometheus /metrics on --host; 0 = none
    kernels: str = "auto"  # attention and KV writes: auto (triton on CUDA), torch or triton
    enforce_eager: bool = False  # no CUDA graphs: every decode step launches its kernels
    cuda_graph_max_batch: int = 256  # decode steps up to this batch replay CUDA graphs
    register_with: str | None = None  # a scheduler's HOST:PORT to register with (registration.py)
    advertise: str | None = None  # the HOST:PORT the scheduler dials; None: host:port
    admin_key: str = field(default="", repr=False)  # the scheduler's Admin API key
    register_heartbeat_s: float = 10.0  # how often to check that the scheduler still knows it
    tensor_parallel_size: int = 1  # ranks (devices) this worker's model is split across
    quantization: str = "none"  # weights: none (the compute dtype) or int8 (weight-only)

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ValueError(f"--block-size must be a power of two, got {self.block_size}")
        if self.kv_cache_gb is not None and self.kv_cache_gb <= 0:
            raise ValueError(f"--kv-cache-gb must be positive, got {self.kv_cache_gb}")
        if not self.step_timeout_s > 0:
            raise ValueError(f"--step-timeout-s must be positive, got {self.step_timeout_s}")
        check_drain_timeout(self.drain_timeout_s)
        check_metrics_port(self.metrics_port)
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"--kernels must be one of {KERNEL_CHOICES}, got {self.kernels!r}")
        if not 1 <= self.cuda_graph_max_batch <= 1024:
            raise ValueError(
                f"--cuda-graph-max-batch must be in 1..1024, got {self.cuda_graph_max_batch}"
            )
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"--tensor-parallel-size must be >= 1, got {self.tensor_parallel_size}"
            )
        self._check_quantization()
        if self.tensor_parallel_size > 1 and self.null:
            raise ValueError("--tensor-parallel-size needs a model: not with --null")
        self._check_registration()

    @property
    def kv_cache_bytes(self) -> int | None:
        """--kv-cache-gb in bytes; None: the runner's default for the device."""
        return None if self.kv_cache_gb is None else int(self.kv_cache_gb * 2**30)

    def _check_quantization(self) -> None:
        if self.quantization not in QUANTIZATION_CHOICES:
            raise ValueError(
                f"--quantization must be one of {QUANTIZATION_CHOICES}, got {self.quantization!r}"
            )
        if self.quantization != "none" and (self.null or self.tensor_parallel_size > 1):
            raise ValueError(
                "--quantization applies to a whole model in one process: not with --null "
                "or --tensor-parallel-size > 1"
            )

    def _check_registration(self) -> None:
        if not self.register_with:
            return
        for flag, value in (
            ("--register-with", self.register_with),
            ("--advertise", self.advertise),
        ):
            if value is not None and not _is_host_port(value):
                raise ValueError(f"{flag} is HOST:PORT, got {value!r}")
        if not self.register_heartbeat_s > 0:
            raise ValueError(
                f"--register-heartbeat-s must be positive, got {self.register_heartbeat_s}"
            )
        if not self.admin_key:
            raise ValueError(
                "--register-with needs LAYERSERVE_ADMIN_KEY: the worker registers through the "
                "scheduler's Admin API, with the scheduler's key"
            )
        if self.advertise is None and self.host in ("0.0.0.0", "::", ""):
            raise ValueError(
                f"--host {self.host} is not an address the scheduler can dial: give --advertise "
                "HOST:PORT (in Kubernetes, the pod IP from the downward API)"
            )

    @property
    def advertised_address(self) -> str:
        """The address the scheduler dials to reach this worker."""
        return self.advertise or f"{self.host}:{self.port}"

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
        p.add_argument(
            "--num-blocks",
            type=int,
            default=env_int("NUM_BLOCKS", 0) or None,
            help="KV blocks in the pool (default: as many as --kv-cache-gb holds); a block holds "
            "--block-size tokens of one KV cache group's layers: all of Llama's, 3 of Gemma 3 "
            "270M's 18 (global and sliding-window layers have their own groups)",
        )
        p.add_argument(
            "--kv-cache-gb",
            type=float,
            default=env_float("KV_CACHE_GB", 0.0) or None,
            help="KV cache size in GiB when --num-blocks is not given (default: 1 on the CPU; "
            "on CUDA 80%% of the memory left free once the weights are loaded)",
        )
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
        p.add_argument(
            "--enforce-eager",
            action="store_true",
            default=env_str("WORKER_ENFORCE_EAGER", "") in ("1", "true"),
            help="never capture CUDA graphs (they are used on CUDA with the Triton kernels)",
        )
        p.add_argument(
            "--cuda-graph-max-batch",
            type=int,
            default=env_int("WORKER_CUDA_GRAPH_MAX_BATCH", 256),
            help="decode steps of up to this many sequences replay a captured CUDA graph; "
            "larger ones run eagerly",
        )
        p.add_argument(
            "--register-with",
            default=env_str("WORKER_REGISTER_WITH", "") or None,
            metavar="HOST:PORT",
            help="a scheduler to register with once serving (its Admin API; the key comes from "
            "LAYERSERVE_ADMIN_KEY); deregisters on SIGTERM",
        )
        p.add_argument(
            "--advertise",
            default=env_str("WORKER_ADVERTISE", "") or None,
            metavar="HOST:PORT",
            help="the address the scheduler dials (default: --host:--port)",
        )
        p.add_argument(
            "--register-heartbeat-s",
            type=float,
            default=env_float("WORKER_REGISTER_HEARTBEAT_S", 10.0),
            help="seconds between checks that the scheduler still knows this worker (a "
            "restarted one has forgotten it: the worker registers again)",
        )
        p.add_argument(
            "--tensor-parallel-size",
            type=int,
            default=env_int("WORKER_TENSOR_PARALLEL_SIZE", 1),
            help="split the model across this many ranks (cuda:0..N-1, or CPU processes); "
            "attention and KV heads must divide by it",
        )
        p.add_argument(
            "--quantization",
            choices=QUANTIZATION_CHOICES,
            default=env_str("WORKER_QUANTIZATION", "none"),
            help="int8: weight-only int8 linear layers (one scale per output channel; "
            "activations, embeddings, norms and the output head stay in --dtype)",
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
            enforce_eager=a.enforce_eager,
            cuda_graph_max_batch=a.cuda_graph_max_batch,
            register_with=a.register_with,
            advertise=a.advertise,
            register_heartbeat_s=a.register_heartbeat_s,
            # From the environment only: a flag would show the key in `ps`.
            admin_key=env_str("ADMIN_KEY", ""),
            tensor_parallel_size=a.tensor_parallel_size,
            quantization=a.quantization,
        )


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()
