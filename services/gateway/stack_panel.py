"""The console's "stack now": what each scheduler says of its models and workers (its
ListModels and GetStats rpcs: replicas, running and waiting requests, KV blocks, prefix cache
hits) and what the gateway measures itself (its Prometheus metrics: requests in flight, tokens
per second, time to first token), as one JSON object for the page (console_routes.py).

The schedulers are LAYERSERVE_SCHEDULER_ADDRESS's (the tokenizer's setting: a comma-separated
list), which `make run` gives the gateway too. A scheduler that does not answer within a second
is shown with its error; the others still are.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.grpc_util import new_channel
from services.gateway.request_metrics import IN_FLIGHT, INTER_TOKEN_LATENCY, TIME_TO_FIRST_TOKEN

_TIMEOUT_S = 1.0


class StackPanel:
    def __init__(self, scheduler_addresses: list[str]) -> None:
        self.addresses = scheduler_addresses
        self._stubs: dict[str, scheduler_pb2_grpc.SchedulerStub] = {}
        self._last_tokens: tuple[float, float] | None = None  # (monotonic time, tokens seen)

    async def snapshot(self) -> dict:
        schedulers = await asyncio.gather(*(self._scheduler(a) for a in self.addresses))
        workers = [w for s in schedulers for w in s["workers"]]
        return {
            "time": time.time(),
            "gateway": self._gateway(),
            "totals": {
                "running": sum(w["running"] for w in workers),
                "waiting": sum(w["waiting"] for w in workers),
                "kv_blocks": sum(w["kv_blocks"] for w in workers),
                "kv_used_blocks": sum(w["kv_used_blocks"] for w in workers),
            },
            "schedulers": schedulers,
        }

    async def close(self) -> None:
        self._stubs.clear()

    async def _scheduler(self, address: str) -> dict:
        stub = self._stubs.get(address)
        if stub is None:
            stub = self._stubs[address] = scheduler_pb2_grpc.SchedulerStub(new_channel(address))
        try:
            models, stats = await asyncio.gather(
                stub.ListModels(scheduler_pb2.ListModelsRequest(), timeout=_TIMEOUT_S),
                stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=_TIMEOUT_S),
            )
        except grpc.RpcError as err:
            error = f"{err.code().name}: {err.details()}"  # type: ignore[attr-defined]
            return {"address": address, "error": error, "models": [], "workers": []}
        return {
            "address": address,
            "error": "",
            "models": [
                {"id": m.id, "max_model_len": m.max_model_len, "replicas": m.replicas}
                for m in models.models
            ],
            "workers": [_worker(w) for w in stats.workers],
        }

    def _gateway(self) -> dict:
        """From the gateway's own metrics: every output token is a first token or a gap."""
        tokens = _total(TIME_TO_FIRST_TOKEN, "_count") + _total(INTER_TOKEN_LATENCY, "_count")
        now = time.monotonic()
        rate = None
        if self._last_tokens is not None and now > self._last_tokens[0]:
            rate = (tokens - self._last_tokens[1]) / (now - self._last_tokens[0])
        self._last_tokens = (now, tokens)
        ttft_count = _total(TIME_TO_FIRST_TOKEN, "_count")
        ttft_sum = _total(TIME_TO_FIRST_TOKEN, "_sum")
        return {
            "requests_in_flight": int(_total(IN_FLIGHT, "")),
            "tokens_per_s": rate,
            "output_tokens": int(tokens),
            "mean_ttft_ms": 1000 * ttft_sum / ttft_count if ttft_count else None,
        }


def _worker(w: scheduler_pb2.WorkerStats) -> dict:
    used = w.num_blocks - w.free_blocks
    return {
        "model": w.model,
        "address": w.address,
        "running": w.running,
        "waiting": w.waiting,
        "kv_blocks": w.num_blocks,
        "kv_used_blocks": used,
        "kv_used": used / w.num_blocks if w.num_blocks else 0.0,
        "prefix_hit_rate": w.prefix_hit_tokens / w.prefix_query_tokens
        if w.prefix_query_tokens
        else None,
        "steps": w.steps,
        "preemptions": w.preemptions,
        "rejected": w.rejected,
        "expired": w.expired,
    }


def _total(metric: object, suffix: str) -> float:
    """The sum of a metric's samples named <name><suffix> over every label set."""
    total = 0.0
    for family in metric.collect():  # type: ignore[attr-defined]
        for sample in family.samples:
            if sample.name == family.name + suffix:
                total += sample.value
    return total
