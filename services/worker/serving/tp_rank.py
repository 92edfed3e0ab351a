"""What one rank of a tensor-parallel worker is, and how it builds its engine: the process
group, its shard of the model and its KV cache."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from gguf import GGUFReader

from services.worker.config import WorkerConfig
from services.worker.engine.model_runner import DTYPES, default_kv_bytes
from services.worker.engine.tp_runner import TensorParallelRunner
from services.worker.layers.attention_backends import choose_attention_backend
from services.worker.layers.kv_cache import PagedKVCache, num_blocks_for_bytes
from services.worker.model import registry
from services.worker.model.config import LlamaConfig
from services.worker.model.llama import LlamaModel
from services.worker.model.loader import default_path, load_model
from services.worker.model.tensor_parallel import check_divisible, shard_config, shard_model

# A collective inside a step waits at most this long for the other ranks: one that is alive
# but stuck then turns into an error instead of a hang. (A rank that dies is noticed at once,
# by the process watch.)
STEP_COLLECTIVE_TIMEOUT = timedelta(minutes=5)
# The other ranks wait for rank 0's next plan for as long as the worker stays idle.
IDLE_TIMEOUT = timedelta(days=3650)


@dataclass(frozen=True, slots=True)
class RankSpec:
    """Everything a rank needs to build its share of the worker; pickled to spawned ranks."""

    world_size: int
    model_path: str | None  # None: the embedded SmolLM2 GGUF
    model_name: str
    device: str  # "cpu", or "cuda" / "cuda:N": rank r runs on cuda:N+r
    dtype: str
    block_size: int
    num_blocks: int | None
    kv_cache_bytes: int | None  # per rank (its own KV heads of every block); None: the default
    max_model_len: int | None
    kernels: str
    threads: int  # torch intra-op threads per rank; 0: torch's default
    master_addr: str = "127.0.0.1"
    master_port: int = 0

    @classmethod
    def from_worker_config(cls, config: WorkerConfig, device: str) -> RankSpec:
        """device: the resolved --device ("cpu", "cuda" or "cuda:N"), never "auto"."""
        return cls(
            world_size=config.tensor_parallel_size,
            model_path=config.model_path,
            model_name=config.model_name,
            device=device,
            dtype=config.dtype,
            block_size=config.block_size,
            num_blocks=config.num_blocks,
            kv_cache_bytes=config.kv_cache_bytes,
            max_model_len=config.max_model_len,
            kernels=config.kernels,
            threads=config.threads,
        )

    def rank_device(self, rank: int) -> torch.device:
        device = torch.device(self.device)
        if device.type != "cuda":
            return device
        return torch.device("cuda", (device.index or 0) + rank)

    def check(self) -> None:
        """ValueError when the model or the machine cannot be split this way (before any
        process starts: reads only the model's config)."""
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        check_divisible(read_model_config(self.model_path), self.world_size)
        last = self.rank_device(self.world_size - 1)
        if last.type == "cuda" and last.index >= torch.cuda.device_count():
            raise ValueError(
                f"tensor-parallel size {self.world_size} on {self.device} needs {last} "
                f"but this machine has {torch.cuda.device_count()} CUDA devices"
            )


def read_model_config(path: str | None) -> LlamaConfig:
    """The model's shape, without loading its weights. ValueError unless it is a Llama: the
    only architecture model/tensor_parallel.py knows how to split."""
    model_path = Path(path) if path else default_path()
    if model_path.is_dir():
        arch = registry.for_hf(model_path)
        config = arch.hf_config(model_path)
    elif model_path.suffix == ".gguf" and model_path.is_file():
        reader = GGUFReader(model_path)
        arch = registry.for_gguf(reader)
        config = arch.gguf_config(reader)
    else:
        raise FileNotFoundError(f"{model_path} is neither a .gguf file nor a checkpoint directory")
    if arch.model_class is not LlamaModel:
        raise ValueError(f"tensor parallelism supports Llama models, not {arch.name}")
    return config


def build_rank_runner(
    spec: RankSpec, rank: int, on_close: Callable[[], None] | None = None
) -> TensorParallelRunner:
    """Joins the process group (waits until all ranks have), then loads and shards the model.
    on_close: see TensorParallelRunner.

    Every rank loads the full weights on the CPU, keeps its shard and moves that to its
    device: one full copy per rank in host memory, fine for small models."""
    device = spec.rank_device(rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if spec.threads:
        torch.set_num_threads(spec.threads)
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{spec.master_addr}:{spec.master_port}",
        rank=rank,
        world_size=spec.world_size,
        timeout=STEP_COLLECTIVE_TIMEOUT,
    )
    control = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    dtype = DTYPES[spec.dtype]
    loaded = load_model(spec.model_path or default_path(), dtype=dtype, device=torch.device("cpu"))
    shard_model(loaded.model, rank, spec.world_size)
    loaded.model.to(device)
    limit = loaded.config.max_position_embeddings
    if spec.max_model_len is not None and not 0 < spec.max_model_len <= limit:
        raise ValueError(f"max_model_len must be in [1, {limit}], got {spec.max_model_len}")
    rank_config = shard_config(loaded.config, spec.world_size)
    num_blocks = spec.num_blocks
    if num_blocks is None:
        budget = spec.kv_cache_bytes
        if budget is None:  # a share of this rank's free memory: ranks may differ
            budget = default_kv_bytes(device)
        own = num_blocks_for_bytes(rank_config, spec.block_size, dtype, budget)
        num_blocks = _fewest_blocks(own, control)
    cache = PagedKVCache(rank_config, num_blocks, spec.block_size, dtype, device)
    return TensorParallelRunner(
        loaded,
        cache,
        rank=rank,
        world_size=spec.world_size,
        control=control,
        on_close=on_close,
        max_model_len=spec.max_model_len or limit,
        model_name=spec.model_name,
        backend=choose_attention_backend(spec.kernels, device, rank_config.head_dim),
    )


def _fewest_blocks(num_blocks: int, group: dist.ProcessGroup) -> int:
    """The smallest pool of all ranks: every rank must hold every block id the scheduler uses."""
    count = torch.tensor([num_blocks], dtype=torch.int64)
    dist.all_reduce(count, op=dist.ReduceOp.MIN, group=group)
    return int(count.item())
