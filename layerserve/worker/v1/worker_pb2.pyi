from layerserve.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DescribeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("model", "block_size", "num_blocks", "max_model_len", "vocab_size", "eos_token_ids", "device", "dtype", "model_fingerprint", "model_path", "kernels", "kv_cache_groups")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    KERNELS_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_GROUPS_FIELD_NUMBER: _ClassVar[int]
    model: str
    block_size: int
    num_blocks: int
    max_model_len: int
    vocab_size: int
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    device: str
    dtype: str
    model_fingerprint: str
    model_path: str
    kernels: str
    kv_cache_groups: _containers.RepeatedCompositeFieldContainer[KVCacheGroup]
    def __init__(self, model: _Optional[str] = ..., block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ..., max_model_len: _Optional[int] = ..., vocab_size: _Optional[int] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., device: _Optional[str] = ..., dtype: _Optional[str] = ..., model_fingerprint: _Optional[str] = ..., model_path: _Optional[str] = ..., kernels: _Optional[str] = ..., kv_cache_groups: _Optional[_Iterable[_Union[KVCacheGroup, _Mapping]]] = ...) -> None: ...

class KVCacheGroup(_message.Message):
    __slots__ = ("num_layers", "sliding_window")
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    SLIDING_WINDOW_FIELD_NUMBER: _ClassVar[int]
    num_layers: int
    sliding_window: int
    def __init__(self, num_layers: _Optional[int] = ..., sliding_window: _Optional[int] = ...) -> None: ...

class BlockTable(_message.Message):
    __slots__ = ("block_ids",)
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class NewSequence(_message.Message):
    __slots__ = ("request_id", "token_ids", "num_prompt_tokens", "num_computed_tokens", "num_new_tokens", "sampling", "trace", "block_tables")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_COMPUTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TABLES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    num_new_tokens: int
    sampling: _common_pb2.SamplingParams
    trace: _common_pb2.TraceContext
    block_tables: _containers.RepeatedCompositeFieldContainer[BlockTable]
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., num_prompt_tokens: _Optional[int] = ..., num_computed_tokens: _Optional[int] = ..., num_new_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., block_tables: _Optional[_Iterable[_Union[BlockTable, _Mapping]]] = ...) -> None: ...

class RunningSequence(_message.Message):
    __slots__ = ("request_id", "num_new_tokens", "trace", "new_block_tables", "draft_token_ids")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_TABLES_FIELD_NUMBER: _ClassVar[int]
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    num_new_tokens: int
    trace: _common_pb2.TraceContext
    new_block_tables: _containers.RepeatedCompositeFieldContainer[BlockTable]
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, request_id: _Optional[str] = ..., num_new_tokens: _Optional[int] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ..., new_block_tables: _Optional[_Iterable[_Union[BlockTable, _Mapping]]] = ..., draft_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("step_id", "new_sequences", "running", "finished_ids", "trace")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    NEW_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    FINISHED_IDS_FIELD_NUMBER: _ClassVar[int]
    TRACE_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    new_sequences: _containers.RepeatedCompositeFieldContainer[NewSequence]
    running: _containers.RepeatedCompositeFieldContainer[RunningSequence]
    finished_ids: _containers.RepeatedScalarFieldContainer[str]
    trace: _common_pb2.TraceContext
    def __init__(self, step_id: _Optional[int] = ..., new_sequences: _Optional[_Iterable[_Union[NewSequence, _Mapping]]] = ..., running: _Optional[_Iterable[_Union[RunningSequence, _Mapping]]] = ..., finished_ids: _Optional[_Iterable[str]] = ..., trace: _Optional[_Union[_common_pb2.TraceContext, _Mapping]] = ...) -> None: ...

class SampledToken(_message.Message):
    __slots__ = ("request_id", "token_id", "logprob", "error", "prompt_logprobs", "embedding")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_id: int
    logprob: _common_pb2.TokenLogprob
    error: _common_pb2.Status
    prompt_logprobs: _containers.RepeatedCompositeFieldContainer[_common_pb2.TokenLogprob]
    embedding: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, request_id: _Optional[str] = ..., token_id: _Optional[int] = ..., logprob: _Optional[_Union[_common_pb2.TokenLogprob, _Mapping]] = ..., error: _Optional[_Union[_common_pb2.Status, _Mapping]] = ..., prompt_logprobs: _Optional[_Iterable[_Union[_common_pb2.TokenLogprob, _Mapping]]] = ..., embedding: _Optional[_Iterable[float]] = ...) -> None: ...

class StepResult(_message.Message):
    __slots__ = ("step_id", "sampled", "forward_ns", "error")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_FIELD_NUMBER: _ClassVar[int]
    FORWARD_NS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    sampled: _containers.RepeatedCompositeFieldContainer[SampledToken]
    forward_ns: int
    error: _common_pb2.Status
    def __init__(self, step_id: _Optional[int] = ..., sampled: _Optional[_Iterable[_Union[SampledToken, _Mapping]]] = ..., forward_ns: _Optional[int] = ..., error: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...
