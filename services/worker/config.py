"""Worker configuration: CLI flags over LAYERSERVE_* environment variables."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.service_settings import drain_timeout_setting, metrics_port_setting
from services.common.settings import (
    at_least,
    check_settings,
    config_from_args,
    in_range,
    positive,
    setting,
)
from services.worker.dtype_choice import DTYPE_CHOICES
from services.worker.kernel_choice import KERNEL_CHOICES
from services.worker.model.quant_choice import (  # model/quant.py does it
    ACTIVATION_CHOICES,
    QUANTIZATION_CHOICES,
)

KV_CACHE_DTYPE_CHOICES = ("auto", "float32", "bfloat16", "int8")  # --kv-cache-dtype

# An engine step that has not returned after this long counts as hung: the worker reports
# NOT_SERVING until a step returns. Generous: a long prefill on a CPU takes seconds.
DEFAULT_STEP_TIMEOUT_S = 120.0


def _power_of_two(n: int) -> str | None:
    return None if n > 0 and not n & (n - 1) else f"must be a power of two, got {n}"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    host: str = setting("--host", env="WORKER_HOST", default="127.0.0.1")
    port: int = setting("--port", env="WORKER_PORT", default=50061)
    model_path: str | None = setting(  # None: the embedded SmolLM2-135M-Instruct GGUF
        "--model-path",
        env="MODEL_PATH",
        help="a .gguf file or a Llama checkpoint directory (default: SmolLM2-135M)",
    )
    model_name: str = setting("--model-name", env="MODEL_NAME", default="smollm2-135m-instruct")
    device: str = setting("--device", env="WORKER_DEVICE", default="auto")
    dtype: str = setting(  # dtype_choice.py resolves auto once the device is known
        "--dtype",
        env="WORKER_DTYPE",
        default="auto",
        choices=DTYPE_CHOICES,
        help="weights, activations and KV cache (auto: bfloat16 on CUDA and on a CPU with "
        "AVX512-BF16 or AMX, float32 on other CPUs)",
    )
    block_size: int = setting("--block-size", env="BLOCK_SIZE", default=16, check=_power_of_two)
    num_blocks: int | None = setting(  # None (or 0 in the environment): as --kv-cache-gb holds
        "--num-blocks",
        env="NUM_BLOCKS",
        help="KV blocks in the pool (default: as many as --kv-cache-gb holds); a block holds "
        "--block-size tokens of one KV cache group's layers: all of Llama's, 3 of Gemma 3 "
        "270M's 18 (global and sliding-window layers have their own groups)",
    )
    kv_cache_gb: float | None = setting(  # None: 1 GiB on the CPU, a share of free memory on CUDA
        "--kv-cache-gb",
        env="KV_CACHE_GB",
        check=positive,
        help="KV cache size in GiB when --num-blocks is not given (default: 1 on the CPU; "
        "on CUDA 80%% of the memory left free once the weights are loaded)",
    )
    kv_cache_dtype: str = setting(  # the KV cache's values: model_runner.KV_CACHE_DTYPES
        "--kv-cache-dtype",
        env="KV_CACHE_DTYPE",
        default="auto",
        choices=KV_CACHE_DTYPE_CHOICES,
        help="the KV cache's dtype (auto: --dtype's); int8: one float32 scale per token and KV "
        "head, computed as each token is written, a quarter of float32's bytes for attention "
        "to read (the CPU's torch kernels only)",
    )
    max_model_len: int | None = setting("--max-model-len", env="MAX_MODEL_LEN")
    threads: int = setting(
        "--threads",
        env="WORKER_THREADS",
        default=0,
        check=at_least(0),
        help="torch intra-op threads (0: one per core this process may use: its affinity, "
        "capped by a cgroup CPU quota such as a Kubernetes CPU limit)",
    )
    null: bool = setting(
        "--null",
        default=False,
        negatable=False,
        help="no model: emit tokens from a fixed cycle (plumbing benchmarks)",
    )
    null_step_seconds: float = setting(  # benchmarks/async_overlap.py
        "--null-step-seconds",
        env="NULL_STEP_SECONDS",
        default=0.0,
        check=at_least(0.0),
        help="with --null: seconds each step sleeps on the model thread, a stand-in for the "
        "device's time",
    )
    step_timeout_s: float = setting(
        "--step-timeout-s",
        env="STEP_TIMEOUT_S",
        default=DEFAULT_STEP_TIMEOUT_S,
        check=positive,
        help="an engine step running longer is taken as hung: NOT_SERVING until one returns",
    )
    kernels: str = setting(  # attention and KV writes: auto (triton on CUDA), torch or triton
        "--kernels",
        env="WORKER_KERNELS",
        default="auto",
        choices=KERNEL_CHOICES,
        help="attention and KV cache writes: Triton kernels or torch ops (auto: Triton on "
        "CUDA, torch on the CPU; triton on the CPU needs TRITON_INTERPRET=1)",
    )
    enforce_eager: bool = setting(  # no CUDA graphs: every decode step launches its kernels
        "--enforce-eager",
        env="WORKER_ENFORCE_EAGER",
        default=False,
        negatable=False,
        parse=lambda raw: raw in ("1", "true"),  # as it always was: any other value is false
        help="never capture CUDA graphs (they are used on CUDA with the Triton kernels)",
    )
    cuda_graph_max_batch: int = setting(
        "--cuda-graph-max-batch",
        env="WORKER_CUDA_GRAPH_MAX_BATCH",
        default=256,
        check=in_range(1, 1024),
        help="decode steps of up to this many sequences replay a captured CUDA graph; "
        "larger ones run eagerly",
    )
    register_with: str | None = setting(  # schedulers' HOST:PORT, home first (registration.py)
        "--register-with",
        env="WORKER_REGISTER_WITH",
        metavar="HOST:PORT[,HOST:PORT...]",
        help="the scheduler to register with once serving (its Admin API; the key comes from "
        "LAYERSERVE_ADMIN_KEY), or several: the first is home, the others take the worker "
        "while home does not answer; deregisters on SIGTERM",
    )
    advertise: str | None = setting(  # None: host:port
        "--advertise",
        env="WORKER_ADVERTISE",
        metavar="HOST:PORT",
        help="the address the scheduler dials (default: --host:--port)",
    )
    # The scheduler's Admin API key. From the environment only: a flag would show it in `ps`.
    admin_key: str = setting(env="ADMIN_KEY", default="", repr=False)
    register_heartbeat_s: float = setting(  # checked by _check_registration
        "--register-heartbeat-s",
        env="WORKER_REGISTER_HEARTBEAT_S",
        default=10.0,
        help="seconds between checks that the scheduler still knows this worker (a "
        "restarted one has forgotten it: the worker registers again)",
    )
    tensor_parallel_size: int = setting(  # ranks (devices) this worker's model is split across
        "--tensor-parallel-size",
        env="WORKER_TENSOR_PARALLEL_SIZE",
        default=1,
        check=at_least(1),
        help="split the model across this many ranks (cuda:0..N-1, or CPU processes); "
        "attention and KV heads must divide by it",
    )
    quantization: str = setting(  # weights: auto, none (the compute dtype), int8, int4, gguf
        "--quantization",
        env="WORKER_QUANTIZATION",
        default="auto",
        choices=QUANTIZATION_CHOICES,
        help="auto: a GGUF's 4-bit weights kept as stored on the CPU, else none; "
        "int8: weight-only int8 linears (one scale per output channel); int4: group-wise "
        "4-bit linears (32 columns a group); gguf: the file's block-quantized tensors kept as "
        "stored (Q4_0/Q4_1/Q4_K 4-bit; Q8_0/Q5_0 as int8 under float32 on the CPU; "
        "activations and norms stay in --dtype)",
    )
    activations: str = setting(  # the 4-bit kernels' activations: quant_choice.ACTIVATION_CHOICES
        "--activations",
        env="WORKER_ACTIVATIONS",
        default="auto",
        choices=ACTIVATION_CHOICES,
        help="what the CPU's kernels for 4-bit and Q8_0 weights multiply them with: float32 "
        "(every sum in float32: greedy text equals float32 dense weights'); int16 or int8 (each "
        "row quantized per 32 columns, sums exact in int32 with AVX512-VNNI or AVX2: a row's "
        "result does not depend on its batch; int8 is llama.cpp's Q8 and costs quality); auto: the "
        "worker's measured choice, logged",
    )
    drain_timeout_s: float = drain_timeout_setting()  # on SIGTERM, for requests it holds
    metrics_port: int = metrics_port_setting()

    def __post_init__(self) -> None:
        check_settings(self)
        self._check_quantization()
        if self.tensor_parallel_size > 1 and self.null:
            raise ValueError("--tensor-parallel-size needs a model: not with --null")
        if self.kv_cache_dtype != "auto" and self.tensor_parallel_size > 1:
            raise ValueError(
                "--kv-cache-dtype applies to one process's cache: not with "
                "--tensor-parallel-size > 1"
            )
        self._check_registration()

    @property
    def kv_cache_bytes(self) -> int | None:
        """--kv-cache-gb in bytes; None: the runner's default for the device."""
        return None if self.kv_cache_gb is None else int(self.kv_cache_gb * 2**30)

    def _check_quantization(self) -> None:
        explicit = self.quantization not in ("none", "auto")  # auto: none where it cannot
        if explicit and (self.null or self.tensor_parallel_size > 1):
            raise ValueError(
                "--quantization applies to a whole model in one process: not with --null "
                "or --tensor-parallel-size > 1"
            )

    def _check_registration(self) -> None:
        if not self.register_with:
            return
        for flag, value in (
            *(("--register-with", s) for s in self.register_with.split(",")),
            ("--advertise", self.advertise),
        ):
            if value is not None and not _is_host_port(value):
                raise ValueError(f"{flag} is HOST:PORT[,HOST:PORT...], got {value!r}")
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
        return config_from_args(cls, argv, "python -m services.worker")


def _is_host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()
