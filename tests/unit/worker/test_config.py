"""The worker's flags and LAYERSERVE_* variables (its KV size: test_kv_size.py; quantization:
test_quant.py)."""

from __future__ import annotations

import pytest

from services.worker.config import WorkerConfig

VARIABLES = ("NUM_BLOCKS", "MAX_MODEL_LEN", "MODEL_PATH", "WORKER_ENFORCE_EAGER", "ADMIN_KEY")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*VARIABLES, "WORKER_REGISTER_WITH", "WORKER_KERNELS", "BLOCK_SIZE"):
        monkeypatch.delenv(f"LAYERSERVE_{name}", raising=False)


def test_an_empty_or_zero_variable_leaves_a_size_to_the_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("NUM_BLOCKS", "MAX_MODEL_LEN"):
        monkeypatch.setenv(f"LAYERSERVE_{name}", "0")
    monkeypatch.setenv("LAYERSERVE_MODEL_PATH", "")
    config = WorkerConfig.from_args([])
    assert (config.num_blocks, config.max_model_len, config.model_path) == (None, None, None)
    monkeypatch.setenv("LAYERSERVE_NUM_BLOCKS", "128")
    assert WorkerConfig.from_args([]).num_blocks == 128
    assert WorkerConfig.from_args(["--num-blocks", "64"]).num_blocks == 64


def test_enforce_eager_from_the_flag_or_1_or_true(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WorkerConfig.from_args([]).enforce_eager is False
    assert WorkerConfig.from_args(["--enforce-eager"]).enforce_eager is True
    for value, eager in (("1", True), ("true", True), ("0", False), ("", False)):
        monkeypatch.setenv("LAYERSERVE_WORKER_ENFORCE_EAGER", value)
        assert WorkerConfig.from_args([]).enforce_eager is eager, value


def test_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="^--block-size must be a power of two, got 24$"):
        WorkerConfig.from_args(["--block-size", "24"])
    monkeypatch.setenv("LAYERSERVE_WORKER_KERNELS", "cuda")
    with pytest.raises(
        ValueError,
        match=r"^LAYERSERVE_WORKER_KERNELS=cuda: must be one of \('auto', 'torch', 'triton'\)",
    ):
        WorkerConfig.from_args([])
    monkeypatch.delenv("LAYERSERVE_WORKER_KERNELS")
    with pytest.raises(ValueError, match="--register-with needs LAYERSERVE_ADMIN_KEY"):
        WorkerConfig.from_args(["--register-with", "s:1"])
    monkeypatch.setenv("LAYERSERVE_ADMIN_KEY", "key-secret")
    config = WorkerConfig.from_args(["--register-with", "s:1"])
    assert config.admin_key == "key-secret" and "key-secret" not in repr(config)
    with pytest.raises(ValueError, match="^--cuda-graph-max-batch must be in 1..1024, got 0$"):
        WorkerConfig.from_args(["--cuda-graph-max-batch", "0"])
