"""LAYERSERVE_TLS_*: what a misconfiguration says at start-up, and what a valid one serves."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from services.common.grpc_util import add_port, new_channel, new_server
from services.common.tls import TlsSettings
from tests.tls_certs import CertFiles, TestCA


@pytest.fixture
def ca(tmp_path: Path) -> TestCA:
    return TestCA(tmp_path)


@pytest.fixture
def leaf(ca: TestCA) -> CertFiles:
    return ca.issue("service")


def env(**values: object) -> dict[str, str]:
    return {f"LAYERSERVE_TLS_{k.upper()}": str(v) for k, v in values.items()}


def test_no_variables_means_plaintext() -> None:
    tls = TlsSettings.from_env({})
    assert not tls.enabled and not tls.can_serve
    tls.require_serving()  # plaintext needs nothing


def test_full_mutual_tls_settings_are_read(ca: TestCA, leaf: CertFiles) -> None:
    tls = TlsSettings.from_env(
        env(cert=leaf.cert, key=leaf.key, ca=ca.path, client_auth="1", server_name="svc.internal")
    )
    assert tls == TlsSettings(leaf.cert, leaf.key, ca.path, True, "svc.internal")
    assert tls.enabled and tls.can_serve
    assert tls.read() == (leaf.cert.read_bytes(), leaf.key.read_bytes(), ca.path.read_bytes())


@pytest.mark.parametrize(
    ("present", "message"),
    [
        ({"cert"}, "LAYERSERVE_TLS_CERT is set without LAYERSERVE_TLS_KEY"),
        ({"key"}, "LAYERSERVE_TLS_KEY is set without LAYERSERVE_TLS_CERT"),
        ({"cert", "key", "client_auth"}, "CLIENT_AUTH=1 needs LAYERSERVE_TLS_CA"),
        ({"ca", "client_auth"}, "CLIENT_AUTH=1 needs LAYERSERVE_TLS_CERT and LAYERSERVE_TLS_KEY"),
    ],
)
def test_incomplete_sets_are_refused(
    ca: TestCA, leaf: CertFiles, present: set[str], message: str
) -> None:
    values = {"cert": leaf.cert, "key": leaf.key, "ca": ca.path, "client_auth": "1"}
    with pytest.raises(ValueError, match=message):
        TlsSettings.from_env(env(**{k: v for k, v in values.items() if k in present}))


def test_a_missing_file_is_named(ca: TestCA, leaf: CertFiles, tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(ValueError, match=f"LAYERSERVE_TLS_CA={missing} is not a readable file"):
        TlsSettings.from_env(env(cert=leaf.cert, key=leaf.key, ca=missing))


def test_a_key_of_another_certificate_is_refused(ca: TestCA, leaf: CertFiles) -> None:
    other = ca.issue("other")
    with pytest.raises(ValueError, match="not a PEM certificate chain and its private key"):
        TlsSettings.from_env(env(cert=leaf.cert, key=other.key))


def test_a_ca_that_is_not_pem_is_refused(leaf: CertFiles, tmp_path: Path) -> None:
    junk = tmp_path / "ca.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ValueError, match="LAYERSERVE_TLS_CA=.* is not a PEM certificate bundle"):
        TlsSettings.from_env(env(cert=leaf.cert, key=leaf.key, ca=junk))


def test_client_auth_takes_a_boolean(ca: TestCA, leaf: CertFiles) -> None:
    with pytest.raises(ValueError, match="LAYERSERVE_TLS_CLIENT_AUTH must be 1 or 0"):
        TlsSettings.from_env(env(cert=leaf.cert, key=leaf.key, ca=ca.path, client_auth="maybe"))


def test_a_ca_alone_dials_tls_but_cannot_serve(ca: TestCA) -> None:
    tls = TlsSettings.from_env(env(ca=ca.path))
    assert tls.enabled and not tls.can_serve
    with pytest.raises(ValueError, match="needs its own certificate to serve TLS"):
        add_port(new_server(), "127.0.0.1:0", tls)


async def _echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return request


async def _serve(tls: TlsSettings) -> tuple[grpc.aio.Server, int]:
    server = new_server()
    handler = grpc.method_handlers_generic_handler(
        "test.Echo", {"Echo": grpc.unary_unary_rpc_method_handler(_echo)}
    )
    server.add_generic_rpc_handlers((handler,))
    port = add_port(server, "127.0.0.1:0", tls)
    await server.start()
    return server, port


async def _echo_call(port: int, tls: TlsSettings) -> bytes:
    async with new_channel(f"127.0.0.1:{port}", tls) as channel:
        return await channel.unary_unary("/test.Echo/Echo")(b"ping", timeout=10)


async def test_one_way_tls_serves_a_client_that_holds_only_the_ca(
    ca: TestCA, leaf: CertFiles
) -> None:
    server, port = await _serve(TlsSettings(leaf.cert, leaf.key, ca.path))
    try:
        assert await _echo_call(port, TlsSettings(ca=ca.path)) == b"ping"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _echo_call(port, TlsSettings())  # plaintext
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await server.stop(0)


async def test_server_name_overrides_the_dialled_host(ca: TestCA) -> None:
    """A certificate issued to a DNS name only, dialled by IP as the launcher does."""
    named = ca.issue("named", dns=("scheduler.internal",), ips=())
    server, port = await _serve(TlsSettings(named.cert, named.key, ca.path))
    try:
        with pytest.raises(grpc.aio.AioRpcError):
            await _echo_call(port, TlsSettings(ca=ca.path))
        client = TlsSettings(ca=ca.path, server_name="scheduler.internal")
        assert await _echo_call(port, client) == b"ping"
    finally:
        await server.stop(0)
