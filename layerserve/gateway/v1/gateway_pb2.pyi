from layerserve.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ToolChoice(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TOOL_CHOICE_UNSPECIFIED: _ClassVar[ToolChoice]
    TOOL_CHOICE_NONE: _ClassVar[ToolChoice]
    TOOL_CHOICE_AUTO: _ClassVar[ToolChoice]
    TOOL_CHOICE_REQUIRED: _ClassVar[ToolChoice]
TOOL_CHOICE_UNSPECIFIED: ToolChoice
TOOL_CHOICE_NONE: ToolChoice
TOOL_CHOICE_AUTO: ToolChoice
TOOL_CHOICE_REQUIRED: ToolChoice

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id", "name")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    name: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments", "index")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    index: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ..., index: _Optional[int] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("model", "prompt", "chat", "max_tokens", "sampling", "stop", "ignore_eos", "tools", "tool_choice", "tool_choice_function", "parallel_tool_calls")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FUNCTION_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    chat: ChatMessages
    max_tokens: int
    sampling: _common_pb2.SamplingParams
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    tool_choice: ToolChoice
    tool_choice_function: str
    parallel_tool_calls: bool
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., max_tokens: _Optional[int] = ..., sampling: _Optional[_Union[_common_pb2.SamplingParams, _Mapping]] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., tool_choice: _Optional[_Union[ToolChoice, str]] = ..., tool_choice_function: _Optional[str] = ..., parallel_tool_calls: _Optional[bool] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("text", "token_ids", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "request_id", "tool_calls")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: _common_pb2.FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    request_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., request_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Model(_message.Message):
    __slots__ = ("id", "max_model_len")
    ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    id: str
    max_model_len: int
    def __init__(self, id: _Optional[str] = ..., max_model_len: _Optional[int] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[Model]
    def __init__(self, models: _Optional[_Iterable[_Union[Model, _Mapping]]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("model", "inputs", "token_inputs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_INPUTS_FIELD_NUMBER: _ClassVar[int]
    model: str
    inputs: _containers.RepeatedScalarFieldContainer[str]
    token_inputs: _containers.RepeatedCompositeFieldContainer[TokenIds]
    def __init__(self, model: _Optional[str] = ..., inputs: _Optional[_Iterable[str]] = ..., token_inputs: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "prompt_tokens", "model")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    embeddings: _containers.RepeatedCompositeFieldContainer[Embedding]
    prompt_tokens: int
    model: str
    def __init__(self, embeddings: _Optional[_Iterable[_Union[Embedding, _Mapping]]] = ..., prompt_tokens: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...
