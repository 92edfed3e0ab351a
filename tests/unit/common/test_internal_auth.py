"""Internal authentication (services/common/internal_auth.py, token_check.py,
token_channel.py): the settings, the bind rule, and a real aio server that refuses calls
without the token while health checks stay open."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.grpc_util import add_port, new_channel, new_server, new_sync_channel
from services.common.internal_auth import (
    METADATA_KEY,
    InternalAuth,
    InternalAuthError,
    generate,
    is_loopback,
)
from services.common.tls import TlsSettings

TOKEN = "a-token-of-enough-characters"
NONE = InternalAuth()
ECHO = "/test.Echo/"


def test_reads_the_token_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert InternalAuth.from_env({}) == NONE
    assert InternalAuth.from_env({"LAYERSERVE_INTERNAL_TOKEN": f" {TOKEN}\n"}).token == TOKEN
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    assert InternalAuth.from_env({"LAYERSERVE_INTERNAL_TOKEN_FILE": str(path)}).token == TOKEN
    allowed = InternalAuth.from_env({"LAYERSERVE_ALLOW_INSECURE_INTERNAL": "1"})
    assert allowed.allow_insecure and allowed.token is None


@pytest.mark.parametrize(
    "env, says",
    [
        ({"LAYERSERVE_INTERNAL_TOKEN": "short"}, "at least 16"),
        ({"LAYERSERVE_INTERNAL_TOKEN": TOKEN, "LAYERSERVE_INTERNAL_TOKEN_FILE": "/x"}, "both"),
        ({"LAYERSERVE_INTERNAL_TOKEN_FILE": "/nonexistent/token"}, "not readable"),
        ({"LAYERSERVE_ALLOW_INSECURE_INTERNAL": "maybe"}, "1 or 0"),
    ],
)
def test_refuses_a_bad_setting_with_one_line(env: dict[str, str], says: str) -> None:
    with pytest.raises(InternalAuthError, match=says) as err:
        InternalAuth.from_env(env)
    assert "\n" not in str(err.value)


def test_generate_writes_a_private_token_once(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "token"
    assert generate(path)
    first = path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert not generate(path)
    assert path.read_text() == first
    assert InternalAuth.from_env({"LAYERSERVE_INTERNAL_TOKEN_FILE": str(path)}).token


@pytest.mark.parametrize(
    "address, loopback",
    [
        ("127.0.0.1:50060", True),
        ("127.3.2.1:1", True),
        ("[::1]:50060", True),
        ("localhost:50060", True),
        ("unix:/tmp/s.sock", True),
        ("0.0.0.0:50060", False),
        ("[::]:50060", False),
        ("10.0.0.5:50060", False),
        ("scheduler:50060", False),
    ],
)
def test_loopback_addresses(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_an_internal_port_beyond_loopback_needs_a_token_or_mutual_tls() -> None:
    plain = TlsSettings()
    NONE.check_bind("127.0.0.1:50060", plain)
    with pytest.raises(InternalAuthError, match="refusing to listen on 0.0.0.0:50060"):
        NONE.check_bind("0.0.0.0:50060", plain)
    InternalAuth(token=TOKEN).check_bind("0.0.0.0:50060", plain)
    InternalAuth(allow_insecure=True).check_bind("0.0.0.0:50060", plain)
    # The same rule through add_port; the gateway's public port is exempt.
    with pytest.raises(InternalAuthError):
        add_port(new_server(auth=NONE), "0.0.0.0:0", plain, auth=NONE)
    assert add_port(new_server(public=True, auth=NONE), "0.0.0.0:0", plain, public=True)


async def _say(request: bytes, context) -> bytes:
    return b"echo " + request


async def _chat(requests, context):
    async for request in requests:
        yield b"echo " + request


def _echo_server(auth: InternalAuth, public: bool = False) -> tuple[grpc.aio.Server, int]:
    server = new_server(public=public, auth=auth)
    handlers = {
        "Say": grpc.unary_unary_rpc_method_handler(_say),
        "Chat": grpc.stream_stream_rpc_method_handler(_chat),
    }
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("test.Echo", handlers)])
    servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = add_port(server, "127.0.0.1:0", TlsSettings(), auth=auth)
    return server, port


async def _code_of(call) -> grpc.StatusCode:
    try:
        await call
    except grpc.aio.AioRpcError as err:
        return err.code()
    return grpc.StatusCode.OK


async def test_a_call_without_or_with_a_wrong_token_is_unauthenticated() -> None:
    server, port = _echo_server(InternalAuth(token=TOKEN))
    await server.start()
    address = f"127.0.0.1:{port}"
    try:
        async with grpc.aio.insecure_channel(address) as raw:
            say = raw.unary_unary(ECHO + "Say")
            assert await _code_of(say(b"hi")) == grpc.StatusCode.UNAUTHENTICATED
            wrong = ((METADATA_KEY, "not-the-token-at-all"),)
            assert await _code_of(say(b"hi", metadata=wrong)) == (grpc.StatusCode.UNAUTHENTICATED)
            chat = raw.stream_stream(ECHO + "Chat")()
            await chat.write(b"hi")
            assert await chat.code() == grpc.StatusCode.UNAUTHENTICATED
            # Health checks stay open.
            check = health_pb2_grpc.HealthStub(raw).Check(health_pb2.HealthCheckRequest())
            assert (await check).status == health_pb2.HealthCheckResponse.SERVING
        wrong_auth = InternalAuth(token="another-token-of-enough-length")
        async with new_channel(address, TlsSettings(), wrong_auth) as channel:
            say = channel.unary_unary(ECHO + "Say")
            assert await _code_of(say(b"hi")) == grpc.StatusCode.UNAUTHENTICATED
        async with new_channel(address, TlsSettings(), InternalAuth(token=TOKEN)) as channel:
            assert await channel.unary_unary(ECHO + "Say")(b"hi", timeout=5) == b"echo hi"
            chat = channel.stream_stream(ECHO + "Chat")()
            for word in (b"a", b"b"):
                await chat.write(word)
                assert await chat.read() == b"echo " + word
            await chat.done_writing()
            assert await chat.code() == grpc.StatusCode.OK
    finally:
        await server.stop(None)


async def test_blocking_clients_send_the_token_and_public_servers_need_none() -> None:
    internal, internal_port = _echo_server(InternalAuth(token=TOKEN))
    public, public_port = _echo_server(InternalAuth(token=TOKEN), public=True)
    await internal.start()
    await public.start()
    try:

        def calls() -> tuple[bytes, bytes]:
            auth = InternalAuth(token=TOKEN)
            with new_sync_channel(f"127.0.0.1:{internal_port}", TlsSettings(), auth) as ch:
                said = ch.unary_unary(ECHO + "Say")(b"sync", timeout=5)
            with grpc.insecure_channel(f"127.0.0.1:{public_port}") as ch:
                return said, ch.unary_unary(ECHO + "Say")(b"public", timeout=5)

        assert await asyncio.to_thread(calls) == (b"echo sync", b"echo public")
    finally:
        await internal.stop(None)
        await public.stop(None)
