"""A gRPC channel (aio or blocking) that sends the internal token with every call.

A proxy rather than a client interceptor: grpc.aio's interceptors put a queue and a task in
front of every `write()` of a stream, and the hops' long-lived streams write once per engine
step. Here a call gets its metadata once, when it starts, and is the channel's own call after.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Metadata = tuple[tuple[str, str], ...]


class _SendsMetadata:
    """A multi-callable (what `channel.unary_unary(...)` returns) that adds `metadata` to the
    caller's own on every call."""

    __slots__ = ("_inner", "_metadata")

    def __init__(self, inner: Any, metadata: Metadata) -> None:
        self._inner = inner
        self._metadata = metadata

    def _merged(self, metadata: Any) -> Metadata:
        return (*self._metadata, *(tuple(metadata) if metadata else ()))

    def __call__(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner(*args, metadata=self._merged(metadata), **kwargs)

    def with_call(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner.with_call(*args, metadata=self._merged(metadata), **kwargs)

    def future(self, *args: Any, metadata: Any = None, **kwargs: Any) -> Any:
        return self._inner.future(*args, metadata=self._merged(metadata), **kwargs)


class TokenChannel:
    """Wraps a grpc.Channel or grpc.aio.Channel; everything but the four multi-callable
    factories and the context-manager protocol passes through unchanged."""

    def __init__(self, channel: Any, metadata: Metadata) -> None:
        self._channel = channel
        self._metadata = metadata

    def _wrap(self, factory: Callable[..., Any], *args: Any, **kwargs: Any) -> _SendsMetadata:
        return _SendsMetadata(factory(*args, **kwargs), self._metadata)

    def unary_unary(self, *args: Any, **kwargs: Any) -> _SendsMetadata:
        return self._wrap(self._channel.unary_unary, *args, **kwargs)

    def unary_stream(self, *args: Any, **kwargs: Any) -> _SendsMetadata:
        return self._wrap(self._channel.unary_stream, *args, **kwargs)

    def stream_unary(self, *args: Any, **kwargs: Any) -> _SendsMetadata:
        return self._wrap(self._channel.stream_unary, *args, **kwargs)

    def stream_stream(self, *args: Any, **kwargs: Any) -> _SendsMetadata:
        return self._wrap(self._channel.stream_stream, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)

    def __enter__(self) -> TokenChannel:
        self._channel.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._channel.__exit__(*exc)

    async def __aenter__(self) -> TokenChannel:
        await self._channel.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._channel.__aexit__(*exc)
