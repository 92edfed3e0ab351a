"""One scheduler replica as the tokenizer sees it: the session stream that carries this
tokenizer's requests to it (services/common/mux.py), its health, the models it serves and the
load of each of its workers, as its last refresh found them (scheduler_pool.py refreshes)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from services.common.grpc_util import new_channel
from services.common.health import service_name
from services.common.mux import MuxClient, MuxProtocol
from services.common.peer_health import PeerHealth
from services.tokenizer.model_catalog import StackView
from services.tokenizer.stack_view_proto import view_from_proto

_UNSPECIFIED = common_pb2.FINISH_REASON_UNSPECIFIED
CALL_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class WorkerView:
    """One worker of a scheduler at its last refresh."""

    address: str  # as the scheduler dials it: with the model, its key in the Redis index
    model: str
    running: int
    waiting: int
    free_blocks: int
    block_size: int  # 0: not reported (then its cache is not looked up)
    fingerprint: str

    @property
    def key(self) -> str:
        """The worker's key in the shared prefix index (model@host:port)."""
        return f"{self.model}@{self.address}"


def worker_view(stats: scheduler_pb2.WorkerStats) -> WorkerView:
    return WorkerView(
        address=stats.address,
        model=stats.model,
        running=stats.running,
        waiting=stats.waiting,
        free_blocks=stats.free_blocks,
        block_size=stats.block_size,
        fingerprint=stats.model_fingerprint,
    )


class SchedulerLink:
    def __init__(self, address: str) -> None:
        self.address = address
        self._channel = new_channel(address)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self.mux: MuxClient = MuxClient(
            MuxProtocol(
                open_stream=self.stub.Session,
                build_request=lambda submits, aborts: scheduler_pb2.SessionRequest(
                    submits=submits, aborts=aborts
                ),
                outputs_of=lambda response: response.outputs,
                request_id_of=lambda output: output.request_id,
                is_final=lambda output: output.finish_reason != _UNSPECIFIED,
                peer=f"scheduler at {address}",
            )
        )
        self.health = PeerHealth(
            self._channel,
            service_name(scheduler_pb2, "Scheduler"),
            f"the scheduler at {address}",
        )
        self.view: StackView | None = None  # its models and aliases; None: never answered
        self.workers: tuple[WorkerView, ...] = ()
        self.requests: set[str] = set()  # this tokenizer's requests running there

    def serves(self, model: str) -> bool:
        """Serving, and at its last refresh it had a ready worker of `model`."""
        return self.health.serving and self.view is not None and model in self.view.models

    async def fetch_view(self) -> StackView:
        response = await self.stub.ListModels(
            scheduler_pb2.ListModelsRequest(), timeout=CALL_TIMEOUT_S
        )
        self.view = view_from_proto(response)
        return self.view

    async def fetch_load(self) -> None:
        stats = await self.stub.GetStats(scheduler_pb2.GetStatsRequest(), timeout=CALL_TIMEOUT_S)
        self.workers = tuple(worker_view(w) for w in stats.workers)

    def start(self) -> None:
        self.health.start()

    async def close(self) -> None:
        await asyncio.gather(self.health.stop(), self.mux.close())
        await self._channel.close()
