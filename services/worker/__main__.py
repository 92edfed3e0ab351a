"""Worker process: `python -m services.worker [--model-path PATH] [--null]`."""

from __future__ import annotations

import dataclasses
import gc
import logging
import time
from pathlib import Path

from layerserve.worker.v1 import worker_pb2, worker_pb2_grpc
from services.common.drain_gate import DrainGate
from services.common.grammar_pool import grammar_pool
from services.common.grpc_util import add_port, new_server, process_tls
from services.common.health import Health, service_name
from services.common.logs import setup_logging
from services.common.metrics import serve_metrics
from services.common.serve import drain_server, run_service, wait_for_shutdown
from services.common.tracing import setup_tracing, shutdown_tracing
from services.worker.config import WorkerConfig
from services.worker.serving.registration import Registration
from services.worker.serving.server import Runner, WorkerServicer

log = logging.getLogger("services.worker")


def build_runner(config: WorkerConfig) -> Runner:
    if config.null:
        from services.worker.engine.null_runner import NullRunner

        return NullRunner(
            block_size=config.block_size,
            num_blocks=config.num_blocks or 65536,
            step_seconds=config.null_step_seconds,
        )
    import torch

    from services.worker.thread_choice import usable_cpus, worker_threads

    threads = worker_threads(config.threads)
    torch.set_num_threads(threads)
    log.info(
        "%d torch threads (%s; %d usable cores)",
        threads,
        "--threads" if config.threads else "auto: one per usable core",
        usable_cpus(),
    )
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    config = _with_dtype(config, device)
    if device.startswith("cuda"):
        _require_platform(device, config.dtype)
    if config.tensor_parallel_size > 1:
        return _start_tensor_parallel(config, device)
    # The load (decoding and repacking weights, zeroing the KV cache) runs on one thread, the
    # steps on `threads`: where another process holds a core, OpenMP's threads wait on each
    # other at every parallel op (SmolLM2 loaded in 24 s with 2 threads against 8 s with 1, on
    # 2 cores at load average 6), and the load gains nothing from a second thread when quiet.
    torch.set_num_threads(1)
    try:
        return _create_runner(config, device)
    finally:
        torch.set_num_threads(threads)


def _create_runner(config: WorkerConfig, device: str) -> Runner:
    """The model's runner: an encoder's or a generator's, loaded from config.model_path."""
    from services.worker.engine.encoder_runner import EncoderRunner
    from services.worker.engine.model_runner import ModelRunner
    from services.worker.model.registry import is_encoder

    try:
        if is_encoder(config.model_path):  # a sentence-embedding model: prefill only
            return EncoderRunner.create(
                config.model_path,
                model_name=config.model_name,
                dtype=config.dtype,
                device=device,
                block_size=config.block_size,
                num_blocks=config.num_blocks,
                max_model_len=config.max_model_len,
                quantization=config.quantization,
            )
        return ModelRunner.create(
            path=config.model_path,
            dtype=config.dtype,
            device=device,
            block_size=config.block_size,
            num_blocks=config.num_blocks,
            kv_cache_bytes=config.kv_cache_bytes,
            max_model_len=config.max_model_len,
            kernels=config.kernels,
            cuda_graph_max_batch=0 if config.enforce_eager else config.cuda_graph_max_batch,
            quantization=config.quantization,
            kv_cache_dtype=config.kv_cache_dtype,
            activations=config.activations,
        )
    except ValueError as e:  # a model, size or kernel choice that cannot work: one clear line
        raise SystemExit(f"worker: cannot start: {e}") from None


def _with_dtype(config: WorkerConfig, device: str) -> WorkerConfig:
    """config with --dtype auto resolved for `device` (dtype_choice.py), the choice logged."""
    import torch

    from services.worker.dtype_choice import resolve_dtype
    from services.worker.model.loader import default_path
    from services.worker.model.quant_choice import keeps_four_bit

    try:
        path = Path(config.model_path) if config.model_path else default_path()
    except FileNotFoundError:  # the load reports it; the dtype does not depend on it
        path = None
    # Tensor-parallel ranks load float weights (config.py refuses --quantization there).
    whole = config.tensor_parallel_size == 1 and not config.null
    four_bit = whole and keeps_four_bit(config.quantization, path, torch.device(device).type)
    try:
        choice = resolve_dtype(config.dtype, torch.device(device), four_bit_weights=four_bit)
    except (ValueError, RuntimeError) as e:  # RuntimeError: a CUDA device that is not there
        raise SystemExit(f"worker: cannot start: {e}") from None
    log.info("compute dtype %s on %s (%s)", choice.dtype, device, choice.reason)
    return dataclasses.replace(config, dtype=choice.dtype)


def _start_tensor_parallel(config: WorkerConfig, device: str) -> Runner:
    """Rank 0 of a worker split across --tensor-parallel-size ranks (serving/tp_launch.py)."""
    from services.worker.serving.tp_launch import start_tensor_parallel
    from services.worker.serving.tp_rank import RankSpec

    try:
        return start_tensor_parallel(RankSpec.from_worker_config(config, device))
    except ValueError as e:
        raise SystemExit(f"worker: cannot split the model: {e}") from None


def _require_platform(device: str, dtype: str) -> None:
    """Ends the process with one clear line when driver, CUDA, torch and triton do not fit."""
    from services.worker.kernels.platform_check import PlatformMismatch, require_platform

    try:
        require_platform(device, dtype)
    except PlatformMismatch as e:
        raise SystemExit(
            f"worker: cannot run on {device} in {dtype}: {e} "
            "(`python -m services.worker.serving.doctor` reports every version)"
        ) from None


async def main() -> None:
    config = WorkerConfig.from_args()
    setup_logging("worker")
    grammar_pool()  # reads its settings now: a bad one stops the start, not a request
    setup_tracing("worker")  # on when OTEL_EXPORTER_OTLP_ENDPOINT is set
    process_tls()  # a bad LAYERSERVE_TLS_* fails now, not after the model has loaded
    started = time.perf_counter()
    runner = build_runner(config)
    log.info(
        "loaded %s on %s (%s, %s kernels) in %.1fs: %d KV blocks of %d tokens, max length %d",
        config.model_name + (" (null worker)" if config.null else ""),
        runner.device,
        runner.dtype
        + ("" if config.quantization == "none" else f" with {config.quantization} weights")
        + ("" if config.kv_cache_dtype == "auto" else f", {config.kv_cache_dtype} KV cache"),
        runner.kernels,
        time.perf_counter() - started,
        runner.num_blocks,
        runner.block_size,
        runner.max_model_len,
    )
    if len(runner.kv_cache_groups) > 1:
        log.info(
            "KV cache groups, each with its own block tables (a block holds %d layers): %s",
            len(runner.kv_cache_groups[0].layers),
            "; ".join(
                f"layers {','.join(map(str, g.layers))} "
                + ("global" if g.window is None else f"window {g.window}")
                for g in runner.kv_cache_groups
            ),
        )
    gate = DrainGate("the worker")
    server = new_server([gate])
    # Absolute, so that the tokenizer service (another process, maybe another working
    # directory) can load the model's tokenizer from it.
    model_path = str(Path(config.model_path).resolve()) if config.model_path else ""
    servicer = WorkerServicer(runner, config.model_name, model_path, config.step_timeout_s)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    health = Health([service_name(worker_pb2, "Worker")], servicer.readiness, name="worker")
    health.add_to(server)
    address = f"{config.host}:{config.port}"
    add_port(server, address)
    serve_metrics(config.metrics_port, config.host, process_tls())
    started = time.perf_counter()
    warming_up = servicer.start_warm_up()  # first: a scheduler's first step queues behind it
    health.start()
    await server.start()
    log.info("worker serving on %s", address)
    try:
        await warming_up
    except Exception:
        log.exception("the warm-up step failed: this worker cannot serve")
        raise
    log.info("warm-up step done in %.2fs", time.perf_counter() - started)
    # What the load and the warm-up left (the model's modules, the tokenizer's tables, torch's
    # and grpc's own) lives as long as the process: frozen, the cyclic collector stops walking
    # it at every full collection (~2% of a batch-1 CPU step, benchmarks/step_profile.py).
    gc.freeze()
    registration = None
    if config.register_with:
        registration = Registration(
            config.register_with,
            config.advertised_address,
            config.admin_key,
            heartbeat_s=config.register_heartbeat_s,
        )
        registration.start()
    await wait_for_shutdown()
    if registration is not None:
        # First: the scheduler stops routing here and lets what runs here finish.
        await registration.deregister(config.drain_timeout_s)
    # A worker holds requests for its scheduler: the drain waits until it has finished them
    # (it routes no new ones to a worker that is NOT_SERVING) or has gone away.
    await drain_server(
        server,
        health,
        gate,
        timeout=config.drain_timeout_s,
        name="worker",
        busy=lambda: servicer.num_held,
    )
    close = getattr(runner, "close", None)
    if close is not None:
        close()  # a tensor-parallel worker's other ranks stop with it
    shutdown_tracing()  # after the drain: the last steps' spans go out too


if __name__ == "__main__":
    run_service(main)
