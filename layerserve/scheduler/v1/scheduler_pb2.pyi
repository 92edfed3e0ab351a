from layerserve.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Submit(_message.Message):
    __slots__ = ("request_id", "model", "prompt_token_ids", "sampling", "max_tokens", "stop_token_ids", "ignore_eos", "priority", "trace", "tenant", "max_tokens_is_cap", "resumed_output_tokens", "migrations")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_IS_CAP_FIELD_NUMBER: _ClassVar[int]
    RESUMED_OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling: _common_pb2.SamplingParams
    max_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    priority: int
    trace: _common_pb2.TraceContext
    tenant: str
    max_tokens_is_cap: bool
    resumed_output_tokens: int
    migrations: int
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., max_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., priority: _Optional[int] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., tenant: _Optional[str] = ..., max_tokens_is_cap: _Optional[bool] = ..., resumed_output_tokens: _Optional[int] = ..., migrations: _Optional[int] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("submits", "aborts")
    SUBMITS_FIELD_NUMBER: _ClassVar[int]
    ABORTS_FIELD_NUMBER: _ClassVar[int]
    submits: _containers.RepeatedCompositeFieldContainer[Submit]
    aborts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, submits: _Optional[_Iterable[_Union[Submit, _Mapping]]] = ..., aborts: _Optional[_Iterable[str]] = ...) -> None: ...

class RequestOutput(_message.Message):
    __slots__ = ("request_id", "token_ids", "logprobs", "finish_reason", "error", "prompt_tokens", "cached_tokens", "model", "prompt_logprobs", "embedding", "migrations")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    MIGRATIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    finish_reason: _common_pb2.FinishReason
    error: _common_pb2.Status
    prompt_tokens: int
    cached_tokens: int
    model: str
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    embedding: _containers.RepeatedScalarFieldContainer[float]
    migrations: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., error: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., model: _Optional[str] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., embedding: _Optional[_Iterable[float]] = ..., migrations: _Optional[int] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("outputs",)
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[RequestOutput]
    def __init__(self, outputs: _Optional[_Iterable[_Union[RequestOutput, _Mapping]]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class WorkerStats(_message.Message):
    __slots__ = ("model", "address", "num_blocks", "free_blocks", "running", "waiting", "steps", "preemptions", "prefix_query_tokens", "prefix_hit_tokens", "rejected", "expired", "block_size", "model_fingerprint")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIONS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_QUERY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    EXPIRED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    model: str
    address: str
    num_blocks: int
    free_blocks: int
    running: int
    waiting: int
    steps: int
    preemptions: int
    prefix_query_tokens: int
    prefix_hit_tokens: int
    rejected: int
    expired: int
    block_size: int
    model_fingerprint: str
    def __init__(self, model: _Optional[str] = ..., address: _Optional[str] = ..., num_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., running: _Optional[int] = ..., waiting: _Optional[int] = ..., steps: _Optional[int] = ..., preemptions: _Optional[int] = ..., prefix_query_tokens: _Optional[int] = ..., prefix_hit_tokens: _Optional[int] = ..., rejected: _Optional[int] = ..., expired: _Optional[int] = ..., block_size: _Optional[int] = ..., model_fingerprint: _Optional[str] = ...) -> None: ...

class SchedulerStats(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStats]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStats, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("id", "max_model_len", "path", "replicas")
    ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    id: str
    max_model_len: int
    path: str
    replicas: int
    def __init__(self, id: _Optional[str] = ..., max_model_len: _Optional[int] = ..., path: _Optional[str] = ..., replicas: _Optional[int] = ...) -> None: ...

class WeightedTarget(_message.Message):
    __slots__ = ("model", "weight")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    model: str
    weight: int
    def __init__(self, model: _Optional[str] = ..., weight: _Optional[int] = ...) -> None: ...

class WeightedRoute(_message.Message):
    __slots__ = ("targets",)
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    targets: _containers.RepeatedCompositeFieldContainer[WeightedTarget]
    def __init__(self, targets: _Optional[_Iterable[_Union[WeightedTarget, _Mapping]]] = ...) -> None: ...

class LengthTier(_message.Message):
    __slots__ = ("max_prompt_tokens", "model")
    MAX_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    max_prompt_tokens: int
    model: str
    def __init__(self, max_prompt_tokens: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class LengthRoute(_message.Message):
    __slots__ = ("tiers",)
    TIERS_FIELD_NUMBER: _ClassVar[int]
    tiers: _containers.RepeatedCompositeFieldContainer[LengthTier]
    def __init__(self, tiers: _Optional[_Iterable[_Union[LengthTier, _Mapping]]] = ...) -> None: ...

class Alias(_message.Message):
    __slots__ = ("name", "weighted", "by_prompt_length")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WEIGHTED_FIELD_NUMBER: _ClassVar[int]
    BY_PROMPT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    name: str
    weighted: WeightedRoute
    by_prompt_length: LengthRoute
    def __init__(self, name: _Optional[str] = ..., weighted: _Optional[_Union[WeightedRoute, _Mapping]] = ..., by_prompt_length: _Optional[_Union[LengthRoute, _Mapping]] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "aliases")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    aliases: _containers.RepeatedCompositeFieldContainer[Alias]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., aliases: _Optional[_Iterable[_Union[Alias, _Mapping]]] = ...) -> None: ...
