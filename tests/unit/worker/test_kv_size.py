"""How big the worker's KV cache is when the operator does not say: 1 GiB on the CPU, a share
of the free memory on CUDA (vLLM's gpu_memory_utilization idea); an explicit size wins."""

from __future__ import annotations

import pytest
import torch

from services.worker.config import WorkerConfig
from services.worker.engine.model_runner import DEFAULT_CPU_KV_BYTES, default_kv_bytes


def test_unset_means_the_devices_default_and_a_size_is_taken_in_gib(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("LAYERSERVE_KV_CACHE_GB", raising=False)
    assert WorkerConfig.from_args([]).kv_cache_bytes is None
    assert WorkerConfig.from_args(["--kv-cache-gb", "2"]).kv_cache_bytes == 2 << 30
    monkeypatch.setenv("LAYERSERVE_KV_CACHE_GB", "0.5")
    assert WorkerConfig.from_args([]).kv_cache_bytes == 1 << 29
    with pytest.raises(ValueError, match="--kv-cache-gb must be positive, got -1"):
        WorkerConfig.from_args(["--kv-cache-gb", "-1"])


def test_the_cpu_default_is_one_gib() -> None:
    assert default_kv_bytes(torch.device("cpu")) == DEFAULT_CPU_KV_BYTES == 1 << 30


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_cuda_default_is_a_share_of_the_free_memory() -> None:
    free, _ = torch.cuda.mem_get_info()
    assert 0.5 * free < default_kv_bytes(torch.device("cuda")) < free
