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
from collections import deque
from collections.abc import Callable

import grpc

from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.grpc_util import new_channel
from services.gateway.request_metrics import IN_FLIGHT, INTER_TOKEN_LATENCY, TIME_TO_FIRST_TOKEN

_TIMEOUT_S = 1.0
_RATE_WINDOW_S = 5.0  # tokens/s is over about this many seconds


class StackPanel:
    def __init__(self, scheduler_addresses: list[str]) -> None:
        self.addresses = scheduler_addresses
        self._stubs: dict[str, scheduler_pb2_grpc.SchedulerStub] = {}
        # (monotonic time, output tokens so far) of the recent snapshots: the rate is taken over
        # the last few seconds, however many pages ask and how often.
        self._tokens_seen: deque[tuple[float, float]] = deque(maxlen=1000)

    async def snapshot(self, may_see: Callable[[str], bool] = lambda model: True) -> dict:
        """may_see(model): whether the caller may know of that model (its key's models)."""
        schedulers = await asyncio.gather(*(self._scheduler(a) for a in self.addresses))
        for s in schedulers:
            s["models"] = [m for m in s["models"] if may_see(m["id"])]
            s["workers"] = [w for w in s["workers"] if may_see(w["model"])]
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
        seen = self._tokens_seen
        while len(seen) > 1 and now - seen[1][0] >= _RATE_WINDOW_S:
            seen.popleft()  # keeps one sample at least the window old
        rate = None
        if seen and now - seen[0][0] > 0.2:
            rate = (tokens - seen[0][1]) / (now - seen[0][0])
        seen.append((now, tokens))
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
