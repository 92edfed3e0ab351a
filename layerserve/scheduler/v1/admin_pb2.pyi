from layerserve.scheduler.v1 import scheduler_pb2 as _scheduler_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_STATE_UNSPECIFIED: _ClassVar[WorkerState]
    WORKER_STATE_CONNECTING: _ClassVar[WorkerState]
    WORKER_STATE_READY: _ClassVar[WorkerState]
    WORKER_STATE_DRAINING: _ClassVar[WorkerState]
WORKER_STATE_UNSPECIFIED: WorkerState
WORKER_STATE_CONNECTING: WorkerState
WORKER_STATE_READY: WorkerState
WORKER_STATE_DRAINING: WorkerState

class WorkerStatus(_message.Message):
    __slots__ = ("address", "model", "model_path", "state", "in_flight", "num_blocks", "free_blocks", "device")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    FREE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    address: str
    model: str
    model_path: str
    state: WorkerState
    in_flight: int
    num_blocks: int
    free_blocks: int
    device: str
    def __init__(self, address: _Optional[str] = ..., model: _Optional[str] = ..., model_path: _Optional[str] = ..., state: _Optional[_Union[WorkerState, str]] = ..., in_flight: _Optional[int] = ..., num_blocks: _Optional[int] = ..., free_blocks: _Optional[int] = ..., device: _Optional[str] = ...) -> None: ...

class AddWorkerRequest(_message.Message):
    __slots__ = ("address", "timeout_seconds")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    address: str
    timeout_seconds: float
    def __init__(self, address: _Optional[str] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class DrainWorkerRequest(_message.Message):
    __slots__ = ("address",)
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    address: str
    def __init__(self, address: _Optional[str] = ...) -> None: ...

class RemoveWorkerRequest(_message.Message):
    __slots__ = ("address", "force", "drain_timeout_seconds")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    FORCE_FIELD_NUMBER: _ClassVar[int]
    DRAIN_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    address: str
    force: bool
    drain_timeout_seconds: float
    def __init__(self, address: _Optional[str] = ..., force: _Optional[bool] = ..., drain_timeout_seconds: _Optional[float] = ...) -> None: ...

class RemoveWorkerResponse(_message.Message):
    __slots__ = ("worker", "requests_ended")
    WORKER_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_ENDED_FIELD_NUMBER: _ClassVar[int]
    worker: WorkerStatus
    requests_ended: int
    def __init__(self, worker: _Optional[_Union[WorkerStatus, _Mapping]] = ..., requests_ended: _Optional[int] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerStatus]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerStatus, _Mapping]]] = ...) -> None: ...

class SetAliasRequest(_message.Message):
    __slots__ = ("alias",)
    ALIAS_FIELD_NUMBER: _ClassVar[int]
    alias: _scheduler_pb2.Alias
    def __init__(self, alias: _Optional[_Union[_scheduler_pb2.Alias, _Mapping]] = ...) -> None: ...

class SetAliasResponse(_message.Message):
    __slots__ = ("replaced",)
    REPLACED_FIELD_NUMBER: _ClassVar[int]
    replaced: bool
    def __init__(self, replaced: _Optional[bool] = ...) -> None: ...

class DeleteAliasRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class DeleteAliasResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
