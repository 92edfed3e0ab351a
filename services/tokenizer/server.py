"""tokenizer.v1.Tokenizer over gRPC. Text requests in from the gateway, token requests out to
the scheduler replicas (scheduler_pool.py routes them; migration.py moves them when a replica
is lost), both multiplexed on one stream per peer; token ids back become text deltas."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor

from layerserve.common.v1 import common_pb2
from layerserve.scheduler.v1 import scheduler_pb2
from layerserve.tokenizer.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common.errors import (
    InvalidArgument,
    LayerserveError,
    Unavailable,
)
from services.common.grpc_util import call_domain
from services.common.mux import Outbox, session_batches
from services.common.sampling_proto import POOLING
from services.tokenizer.chat_request import tokenize, tool_call_parser, tool_format_of
from services.tokenizer.loader import load_tokenizer
from services.tokenizer.migration import DEFAULT_MAX_MIGRATIONS, MigratingSink
from services.tokenizer.model_catalog import ModelCatalog
from services.tokenizer.output_sink import OutputSink, error_output
from services.tokenizer.prefix_lookup import PrefixLookup
from services.tokenizer.request_events import RequestEvents, RequestListener
from services.tokenizer.request_trace import RequestTracer
from services.tokenizer.scheduler_pool import SchedulerPool
from services.tokenizer.structured_check import check_structured_async, structured_of
from services.tokenizer.text_model import TextModel
from services.tokenizer.text_stream import TextStream
from services.tokenizer.tokenize_metrics import TokenizeMetrics

log = logging.getLogger(__name__)

GenerateOutput = tokenizer_pb2.GenerateOutput
_UNSPECIFIED = common_pb2.FINISH_REASON_UNSPECIFIED
_SHUTTING_DOWN = Unavailable("the tokenizer service is shutting down; retry shortly")


def _wants_prompt_logprobs(request: tokenizer_pb2.GenerateRequest) -> bool:
    return request.sampling.HasField("prompt_logprobs")


def _sampling(
    request: tokenizer_pb2.GenerateRequest, model: TextModel
) -> common_pb2.SamplingParams:
    """The model's recommended settings for the fields the client left out, and for an
    embedding request the model's pooling."""
    sampling = model.sampling_defaults.apply(request.sampling, request.sampling_unset)
    if request.embed:
        pooled = common_pb2.SamplingParams()
        pooled.CopyFrom(sampling)
        pooled.pooling = POOLING[model.pooling]  # type: ignore[assignment]
        return pooled
    return sampling


def check_prompt_length(num_tokens: int, limit: int) -> None:
    if limit and num_tokens > limit:
        raise InvalidArgument(
            f"the prompt is {num_tokens} tokens; this server accepts at most {limit}",
            param="prompt",
        )


class TokenizerServicer(tokenizer_pb2_grpc.TokenizerServicer):
    def __init__(
        self,
        models: dict[str, TextModel],
        schedulers: str,  # --scheduler: HOST:PORT[,...] or dns:///HOST:PORT
        threads: int,
        catalog_ttl: float = 2.0,
        listeners: Iterable[RequestListener] | None = None,  # default: tracing and metrics
        tool_parser: str = "auto",  # --tool-parser: the tool format, or auto per model family
        redis_url: str = "",  # --redis-url: the schedulers' prefix index ("" = none)
        max_migrations: int = DEFAULT_MAX_MIGRATIONS,
        defaults_file: str | None = None,  # GGUF sampling defaults; None: model defaults off
    ) -> None:
        self._tool_parser = tool_parser
        self._defaults_file = defaults_file
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tokenize")
        # Loading a tokenizer takes seconds: never in the pool that tokenizes prompts.
        self._load_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="load-tokenizer")
        prefix = PrefixLookup(redis_url) if redis_url else None
        self._schedulers = SchedulerPool(schedulers, prefix=prefix)
        self._max_migrations = max_migrations
        self._catalog = ModelCatalog(models, self._schedulers.fetch_view, self._load, catalog_ttl)
        self._sessions: set[Outbox[GenerateOutput]] = set()
        self._draining = False
        if listeners is None:
            listeners = (RequestTracer(), TokenizeMetrics())
        self._events = RequestEvents(listeners)

    def readiness(self) -> str | None:
        """Why this service cannot serve now (its tokenizers are loaded before it starts),
        or None."""
        return self._schedulers.readiness()

    def start(self) -> None:
        """Follows the scheduler replicas (health, models, load); call once the loop runs."""
        self._schedulers.start()

    def stop_taking(self) -> None:
        """Drain: refuse new requests; each session ends once its requests have."""
        self._draining = True
        for outbox in self._sessions:
            outbox.wake()

    async def close(self) -> None:
        await self._schedulers.close()

    async def _load(self, path: str | None) -> TextModel:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._load_pool, load_tokenizer, path, self._defaults_file
        )

    async def _tokenize(self, model_name: str, msg) -> list[int]:
        model = await self._catalog.text_model(model_name)
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        ids = await loop.run_in_executor(self._pool, tokenize, model, msg, self._tool_parser)
        self._events.prompt_encoded(model_name, time.monotonic() - started)
        return ids

    async def _check_structured(self, model: TextModel, sampling) -> None:
        """A constraint whose grammar does not compile is refused here (InvalidArgument)."""
        structured = structured_of(sampling)
        if structured is not None:
            await check_structured_async(model, structured)  # in a grammar process

    async def _prepare(self, request) -> tuple[str, TextModel, list[int]]:
        """Resolves the request's model (an alias picks a target) and tokenizes the prompt
        with the target's tokenizer. Returns the target, its tokenizer and the prompt ids."""
        measured: dict[str, list[int]] = {}

        async def measure(model_name: str) -> int:
            measured[model_name] = await self._tokenize(model_name, request)
            return len(measured[model_name])

        target = await self._catalog.resolve(request.model, measure)
        model = await self._catalog.text_model(target)
        ids = measured.get(target)
        if ids is None:
            ids = await self._tokenize(target, request)
        return target, model, ids

    async def Tokenize(self, request, context) -> tokenizer_pb2.TokenizeResponse:
        """An alias tokenizes with its first target's tokenizer (no target is picked)."""

        async def run() -> tokenizer_pb2.TokenizeResponse:
            found = await self._catalog.lookup(request.model)
            ids = await self._tokenize(found if isinstance(found, str) else found.first, request)
            return tokenizer_pb2.TokenizeResponse(token_ids=ids)

        return await call_domain(context, run)

    async def ListModels(self, request, context) -> tokenizer_pb2.ListModelsResponse:
        """Models the scheduler serves (with a tokenizer here), and aliases over them."""

        async def run() -> tokenizer_pb2.ListModelsResponse:
            listing = await self._catalog.listing()
            return tokenizer_pb2.ListModelsResponse(
                models=[tokenizer_pb2.ModelInfo(id=n, max_model_len=m) for n, m in listing]
            )

        return await call_domain(context, run)

    async def Session(
        self, request_iterator, context
    ) -> AsyncIterator[tokenizer_pb2.SessionResponse]:
        outbox: Outbox[GenerateOutput] = Outbox()
        open_ids: set[str] = set()
        reader = asyncio.ensure_future(self._read(request_iterator, outbox, open_ids))
        self._sessions.add(outbox)
        try:
            async for batch in session_batches(
                outbox, reader, lambda: bool(open_ids), lambda: self._draining
            ):
                yield tokenizer_pb2.SessionResponse(outputs=batch)
        finally:
            self._sessions.discard(outbox)
            reader.cancel()
            for request_id in list(open_ids):
                self._abort(request_id)
            open_ids.clear()

    async def _read(self, request_iterator, outbox: Outbox, open_ids: set[str]) -> None:
        async for msg in request_iterator:
            for request_id in msg.aborts:
                open_ids.discard(request_id)
                self._abort(request_id)
            for request in msg.requests:
                if request.request_id in open_ids:
                    outbox.put(
                        error_output(request.request_id, InvalidArgument("duplicate request_id"))
                    )
                    continue
                if self._draining:
                    outbox.put(error_output(request.request_id, _SHUTTING_DOWN))
                    continue
                open_ids.add(request.request_id)
                asyncio.ensure_future(self._start(request, outbox, open_ids))

    def _abort(self, request_id: str) -> None:
        self._schedulers.abort(request_id)
        self._events.aborted(request_id)

    async def _start(self, request, outbox: Outbox, open_ids: set[str]) -> None:
        """Tokenizes off the event loop, then hands the request to the scheduler. Whatever
        fails before the hand-over ends this request with an error, never silently."""
        request_id = request.request_id
        self._events.started(request)
        try:
            target, model, prompt_ids = await self._prepare(request)
            check_prompt_length(len(prompt_ids), request.max_prompt_tokens)
            await self._check_structured(model, request.sampling)
            link = await self._schedulers.choose(target, prompt_ids)
            self._events.tokenized(request_id, target, len(prompt_ids))
            if request_id not in open_ids:
                return  # aborted while tokenizing
            self._hand_over(request, target, model, prompt_ids, link, outbox, open_ids)
        except LayerserveError as err:
            self._fail(request_id, err, err, outbox, open_ids)
        except Exception as exc:
            log.exception("starting request %s failed", request_id)
            self._fail(request_id, LayerserveError("tokenization failed"), exc, outbox, open_ids)

    def _hand_over(self, request, target, model, prompt_ids, link, outbox, open_ids) -> None:
        """Submits the tokenized request to the scheduler `link` leads to; its outputs go to
        the session's outbox as text."""
        request_id = request.request_id
        stream = TextStream.create(
            model, prompt_ids, list(request.stop), request.skip_special_tokens
        )
        submit = scheduler_pb2.Submit(
            request_id=request_id,
            model=target,
            prompt_token_ids=prompt_ids,
            sampling=_sampling(request, model),
            max_tokens=request.max_tokens,
            max_tokens_is_cap=request.max_tokens_is_cap,
            stop_token_ids=request.stop_token_ids,
            ignore_eos=request.ignore_eos,
            priority=request.priority,
            trace=request.trace,
            tenant=request.tenant,
        )
        self._events.submitting(request_id, submit)
        tool_format = tool_format_of(self._tool_parser, model)
        tools = tool_call_parser(request.tool_call_parsing, tool_format)
        # An empty prompt has no first token; the scheduler refuses it with a clear error.
        wants_first = prompt_ids and _wants_prompt_logprobs(request)
        sink = OutputSink(
            request_id,
            target,
            stream,
            outbox,
            open_ids,
            self._schedulers,
            self._events,
            tools,
            echo_text=model.decode(prompt_ids) if request.echo else None,
            first_prompt_token=prompt_ids[0] if wants_first else -1,
        )
        MigratingSink(
            submit, sink, self._schedulers, link, self._events, self._max_migrations
        ).start()

    def _fail(
        self,
        request_id: str,
        err: LayerserveError,
        cause: BaseException,
        outbox: Outbox,
        open_ids: set[str],
    ) -> None:
        """Ends a request that could not be tokenized: `err` to the gateway, `cause` to the
        listeners."""
        open_ids.discard(request_id)
        outbox.put(error_output(request_id, err))
        self._events.failed(request_id, cause)
