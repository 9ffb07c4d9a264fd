"""TLS toward the client and toward an https:// upstream (shell/tls.py).

The proxy terminates TLS with a certificate from its own local CA and splices the decrypted
bytes into the unchanged relay; these tests hold it to byte-exact payloads and to the end
mapping of docs/tls-http2.md (close_notify/FIN <-> FIN, RST <-> RST), on real loopback
sockets bounded by trio's fail_after.
"""

from __future__ import annotations

import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
import trio
import trustme
from cryptography import x509
from trio.testing import MockClock

from middlebox.core.stream import Direction
from middlebox.scenario.model import Scenario, TlsOptions
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen
from middlebox.shell.tls import LocalCA, loopback_pair, server_context, upstream_context
from tests.harness import Handler, proxied, read_all, reset

RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    b'data: {"choices":[{"delta":{"content":"caf\xc3\xa9"}}]}\n\ndata: [DONE]\n\n'
)
REQUEST = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def client_context(ca: LocalCA, alpn: str = "http/1.1") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca.cert_path))
    context.set_alpn_protocols([alpn])
    return context


async def tls_connect(port: int, ca: LocalCA, alpn: str = "http/1.1") -> trio.SSLStream:
    return await trio.open_ssl_over_tcp_stream(
        "127.0.0.1", port, ssl_context=client_context(ca, alpn), https_compatible=True
    )


async def read_tls(stream: trio.SSLStream) -> tuple[bytes, str]:
    """Read to the end: 'fin' for close_notify or a clean TCP end, 'rst' for a reset."""
    received = bytearray()
    while True:
        try:
            data = await stream.receive_some(65536)
        except trio.BrokenResourceError:
            return bytes(received), "rst"
        if not data:
            return bytes(received), "fin"
        received += data


# ------------------------------------------------------------------ the local CA


def test_the_local_ca_is_created_once_with_a_private_key_only_its_owner_reads(
    tmp_path: Path,
) -> None:
    ca = LocalCA.load_or_create(tmp_path / "ca")
    first = ca.cert_path.read_bytes()
    assert stat.S_IMODE(ca.key_path.stat().st_mode) == 0o600
    again = LocalCA.load_or_create(tmp_path / "ca")
    assert again.cert_path.read_bytes() == first  # trusted once, valid across runs
    cert = x509.load_pem_x509_certificate(first)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_an_issued_certificate_names_every_host_in_subject_alt_name(tmp_path: Path) -> None:
    ca = LocalCA.load_or_create(tmp_path)
    chain, key = ca.issue(["localhost", "127.0.0.1", "::1", "proxy.test"])
    leaf = x509.load_pem_x509_certificate(chain)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "proxy.test"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
    ]
    assert leaf.issuer == x509.load_pem_x509_certificate(ca.cert_path.read_bytes()).subject
    assert chain.endswith(ca.cert_path.read_bytes())  # the chain carries the CA after it
    assert b"PRIVATE KEY" in key


def test_the_ca_directory_defaults_to_the_environment_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MIDDLEBOX_CA_DIR", str(tmp_path / "from-env"))
    ca = LocalCA.load_or_create()
    assert ca.cert_path == tmp_path / "from-env" / "ca.pem"
    assert ca.cert_path.exists()


def test_tls_options_refuse_an_empty_alpn_list_or_no_hostname() -> None:
    with pytest.raises(ValueError, match="alpn"):
        TlsOptions(alpn=())
    with pytest.raises(ValueError, match="hostnames"):
        TlsOptions(hostnames=())


def test_the_upstream_context_verifies_unless_told_not_to() -> None:
    assert upstream_context().verify_mode is ssl.CERT_REQUIRED
    assert upstream_context().check_hostname
    insecure = upstream_context(insecure=True)
    assert insecure.verify_mode is ssl.CERT_NONE and not insecure.check_hostname


# ------------------------------------------------------------------ addresses


def test_an_https_url_is_a_tls_upstream_on_port_443_by_default() -> None:
    assert Address.parse("https://api.example") == Address("api.example", 443, tls=True)
    assert Address.parse("https://127.0.0.1:8443").port == 8443
    assert Address.parse("http://127.0.0.1:8000") == Address("127.0.0.1", 8000, tls=False)
    with pytest.raises(ValueError, match="http:// and https://"):
        Address.parse("ftp://127.0.0.1:21")


def test_the_loopback_pair_is_connected_both_ways() -> None:
    relay_end, splice_end = loopback_pair()
    try:
        relay_end.setblocking(True)
        splice_end.setblocking(True)
        relay_end.sendall(b"ping")
        assert splice_end.recv(16) == b"ping"
        splice_end.sendall(b"pong")
        assert relay_end.recv(16) == b"pong"
        assert relay_end.getpeername() == splice_end.getsockname()
    finally:
        relay_end.close()
        splice_end.close()


# ------------------------------------------------------------------ client side


async def answer_fixed(stream: trio.SocketStream) -> None:
    received = b""
    while not received.endswith(b"{}"):
        data = await stream.receive_some(65536)
        if not data:
            return
        received += data
    await stream.send_all(RESPONSE)
    await stream.aclose()


async def test_a_tls_client_gets_the_upstream_bytes_exactly_and_a_clean_end(
    tmp_path: Path,
) -> None:
    tls = TlsOptions(ca_dir=str(tmp_path))
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with proxied(answer_fixed, tls=tls) as running:
            stream = await tls_connect(running.proxy_port, ca)
            await stream.send_all(REQUEST)
            assert await read_tls(stream) == (RESPONSE, "fin")
            await stream.aclose()


async def test_the_scenario_proxy_block_turns_tls_on(tmp_path: Path) -> None:
    scenario = Scenario(name="tls")
    scenario = Scenario(
        name="tls",
        proxy=type(scenario.proxy)(tls=TlsOptions(ca_dir=str(tmp_path))),
    )
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with proxied(answer_fixed, scenario) as running:
            stream = await tls_connect(running.proxy_port, ca)
            await stream.send_all(REQUEST)
            body, end = await read_tls(stream)
            assert body == RESPONSE and end == "fin"


async def test_a_client_speaking_cleartext_to_a_tls_listener_is_counted_and_closed(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    with trio.fail_after(10):
        async with proxied(answer_fixed, tls=TlsOptions(ca_dir=str(tmp_path))) as running:
            stream = await running.connect()
            await stream.send_all(REQUEST)
            data, _end = await read_all(stream)
            assert b"200 OK" not in data
            while running.server.active:
                await trio.sleep(0.01)
            assert running.server.tls_handshake_failures == 1


async def test_an_upstream_reset_reaches_the_tls_client_as_a_reset_not_a_clean_end(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    async def reset_mid_answer(stream: trio.SocketStream) -> None:
        await stream.receive_some(65536)
        await stream.send_all(RESPONSE[:60])
        await trio.sleep(0.05)
        reset(stream)

    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with proxied(reset_mid_answer, tls=TlsOptions(ca_dir=str(tmp_path))) as running:
            stream = await tls_connect(running.proxy_port, ca)
            await stream.send_all(REQUEST)
            body, end = await read_tls(stream)
            assert (body, end) == (RESPONSE[:60], "rst")


def recording_upstream() -> tuple[list[tuple[bytes, str]], trio.Event, Handler]:
    """An upstream that notes what one connection sent and how it ended ("fin"/"rst")."""
    seen: list[tuple[bytes, str]] = []
    done = trio.Event()

    async def record(stream: trio.SocketStream) -> None:
        seen.append(await read_all(stream))
        done.set()

    return seen, done, record


async def test_the_tls_clients_close_reaches_the_upstream_as_a_fin(tmp_path: Path) -> None:
    seen, done, record = recording_upstream()
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with proxied(record, tls=TlsOptions(ca_dir=str(tmp_path))) as running:
            stream = await tls_connect(running.proxy_port, ca)
            await stream.send_all(REQUEST)
            await stream.aclose()  # close_notify, then the TCP close
            await done.wait()
    assert seen == [(REQUEST, "fin")]


async def test_the_tls_clients_reset_reaches_the_upstream_as_a_reset(
    tmp_path: Path, autojump_clock: MockClock
) -> None:
    seen, done, record = recording_upstream()
    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with proxied(record, tls=TlsOptions(ca_dir=str(tmp_path))) as running:
            stream = await tls_connect(running.proxy_port, ca)
            await stream.send_all(REQUEST)
            await trio.sleep(0.05)  # the request crosses before the reset
            transport = stream.transport_stream
            assert isinstance(transport, trio.SocketStream)
            reset(transport)
            await done.wait()
    assert seen == [(REQUEST, "rst")]


async def test_the_journal_sees_the_decrypted_http(tmp_path: Path) -> None:
    reads: list[tuple[str, bytes]] = []

    class Recorder:
        def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
            reads.append((leg, data))

        def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
            pass

        def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
            pass

    ca = LocalCA.load_or_create(tmp_path)
    with trio.fail_after(10):
        async with proxied(
            answer_fixed,
            tls=TlsOptions(ca_dir=str(tmp_path)),
            observer_factory=lambda _cid, _s: Recorder(),
        ) as running:
            stream = await tls_connect(running.proxy_port, ca)
            await stream.send_all(REQUEST)
            await read_tls(stream)
    assert b"".join(d for leg, d in reads if leg == "client") == REQUEST
    assert b"".join(d for leg, d in reads if leg == "upstream") == RESPONSE


# ------------------------------------------------------------------ https upstreams


async def tls_upstream(nursery: trio.Nursery, ca: trustme.CA) -> int:
    """A trio TLS server with a trustme certificate for 127.0.0.1 answering RESPONSE."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)

    async def handler(stream: trio.SSLStream) -> None:
        try:
            await answer_fixed(stream)  # type: ignore[arg-type]
        except trio.BrokenResourceError:
            pass  # a client that refused our certificate

    listeners = await nursery.start(
        trio.serve_listeners,
        handler,
        [
            trio.SSLListener(tcp, context, https_compatible=True)
            for tcp in await trio.open_tcp_listeners(0, host="127.0.0.1")
        ],
    )
    return int(listeners[0].transport_listener.socket.getsockname()[1])


async def ask_through(server: ProxyServer) -> bytes:
    async with trio.open_nursery() as nursery:
        listener = listen(Address("127.0.0.1", 0))
        port = await nursery.start(server.serve, listener)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(REQUEST)
        data, _ = await read_all(stream)
        nursery.cancel_scope.cancel()
        listener.close()
    return data


@pytest.mark.parametrize(
    ("trust", "answered"),
    [("ca_file", RESPONSE), ("insecure", RESPONSE), ("nothing", b"502 Bad Gateway")],
)
async def test_an_https_upstream_is_verified_against_a_ca_file_unless_insecure(
    tmp_path: Path, trust: str, answered: bytes
) -> None:
    from middlebox.compose import PROXY_STAGES

    ca = trustme.CA()
    ca_file = tmp_path / "upstream-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await tls_upstream(nursery, ca)
            config = ProxyConfig(
                Address("127.0.0.1", port, tls=True),
                Scenario(name="https-upstream"),
                stages=PROXY_STAGES,
                upstream_ca=str(ca_file) if trust == "ca_file" else None,
                upstream_insecure=trust == "insecure",
            )
            server = ProxyServer(config)
            data = await ask_through(server)
            nursery.cancel_scope.cancel()
    assert answered in data
    assert (server.connections_failed == 1) == (trust == "nothing")


def test_server_contexts_offer_the_configured_alpn_protocols(tmp_path: Path) -> None:
    context = server_context(TlsOptions(alpn=("http/1.1",), ca_dir=str(tmp_path)))
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_NONE  # clients bring no certificate
