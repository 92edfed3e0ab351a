"""Which worker runs a request: by model, then the least loaded ready replica."""

from __future__ import annotations

from layerserve.scheduler.v1 import scheduler_pb2
from services.common.errors import NotFound, Unavailable
from services.common.sampling import SamplingOptions
from services.scheduler.admission import ModelLimits, admit
from services.scheduler.worker_link import WorkerLink


class Router:
    def __init__(self, links: list[WorkerLink]) -> None:
        self.links = links
        self._owner: dict[str, WorkerLink] = {}

    def models(self) -> dict[str, int]:
        """Served model names and their context lengths (ready workers only)."""
        return {
            link.info.model: link.info.max_model_len
            for link in self.links
            if link.ready and link.info is not None
        }

    def submit(self, msg: scheduler_pb2.Submit) -> None:
        """Routes and queues a request. Raises NotFound, Unavailable or InvalidArgument."""
        link = self._pick(msg.model)
        info = link.info
        assert info is not None
        limits = ModelLimits(
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            block_size=info.block_size,
            num_blocks=info.num_blocks,
            eos_token_ids=frozenset(info.eos_token_ids),
        )
        request = admit(
            request_id=msg.request_id,
            prompt_token_ids=list(msg.prompt_token_ids),
            max_tokens=msg.max_tokens,
            sampling=SamplingOptions.from_proto(msg.sampling),
            stop_token_ids=list(msg.stop_token_ids),
            ignore_eos=msg.ignore_eos,
            priority=msg.priority,
            trace_context=dict(msg.trace.carrier),
            limits=limits,
        )
        self._owner[request.request_id] = link
        link.submit(request)

    def abort(self, request_id: str) -> None:
        link = self._owner.pop(request_id, None)
        if link is not None:
            link.abort(request_id)

    def forget(self, request_id: str) -> None:
        """The request finished; it no longer needs routing."""
        self._owner.pop(request_id, None)

    def _pick(self, model: str) -> WorkerLink:
        replicas = [
            link for link in self.links if link.info is not None and link.info.model == model
        ]
        if not replicas:
            raise NotFound(f"The model `{model}` does not exist.", param="model")
        ready = [link for link in replicas if link.ready]
        if not ready:
            raise Unavailable(f"no worker for model `{model}` is ready; retry shortly")
        return min(ready, key=lambda link: link.load)
