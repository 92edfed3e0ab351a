"""What a worker says about itself when the scheduler connects (worker.v1.WorkerInfo, as the
scheduler uses it)."""

from __future__ import annotations

from dataclasses import dataclass

from services.scheduler.kv_cache_manager import Windows


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    model: str
    block_size: int  # tokens per KV block
    num_blocks: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: frozenset[int] = frozenset()
    model_fingerprint: str = ""  # the same for replicas with the same weights
    model_path: str = ""  # "" = the embedded default model
    device: str = ""
    windows: Windows = (None,)  # its KV cache groups (kv_cache_manager.group_windows)
