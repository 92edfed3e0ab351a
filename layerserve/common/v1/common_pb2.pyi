from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Pooling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOLING_UNSPECIFIED: _ClassVar[Pooling]
    POOLING_LAST: _ClassVar[Pooling]
    POOLING_MEAN: _ClassVar[Pooling]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORT: _ClassVar[FinishReason]
    FINISH_REASON_ERROR: _ClassVar[FinishReason]
POOLING_UNSPECIFIED: Pooling
POOLING_LAST: Pooling
POOLING_MEAN: Pooling
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORT: FinishReason
FINISH_REASON_ERROR: FinishReason

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "logprobs", "structured", "prompt_logprobs", "pooling")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    seed: int
    logprobs: int
    structured: StructuredOutput
    prompt_logprobs: int
    pooling: Pooling
    def __init__(self, temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., logprobs: _Optional[int] = ..., structured: _Optional[_Union[StructuredOutput, _Mapping]] = ..., prompt_logprobs: _Optional[int] = ..., pooling: _Optional[_Union[Pooling, str]] = ...) -> None: ...

class StructuredOutput(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "choice", "grammar")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    choice: Choices
    grammar: str
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class TraceContext(_message.Message):
    __slots__ = ("carrier",)
    class CarrierEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CARRIER_FIELD_NUMBER: _ClassVar[int]
    carrier: _containers.ScalarMap[str, str]
    def __init__(self, carrier: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message", "param")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    param: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., param: _Optional[str] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...
