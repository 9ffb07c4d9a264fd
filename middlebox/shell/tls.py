"""TLS on either hop: a local CA, the SSL contexts, and the splice that carries TLS to the relay.

The relay's hot path is raw non-blocking sockets read by an epoll hub (shell/hub.py), and
cleartext HTTP/1.1 keeps exactly that path. A TLS connection gets its own path in front of
it: the TLS stream (trio.SSLStream over the accepted TCP socket) is spliced to one end of a
connected loopback TCP pair, and the relay gets the other end as if it were the client (or,
for an `https://` upstream, the upstream). The relay, the pipeline, the journal and the pcap
therefore see the decrypted HTTP/1.1 bytes, and every fault works unchanged.

The pair is TCP, not a Unix socketpair, because the relay's ends are TCP's: a FIN is
`shutdown(SHUT_WR)` and an RST is `SO_LINGER(1, 0)` then close, and only TCP carries both.
How the ends cross the TLS layer (docs/tls-http2.md):

    TLS side                                   relay side (loopback TCP)
    close_notify, or a TCP FIN without one  -> FIN  (a ragged EOF is an EOF, as browsers
                                                     and curl treat it: trio's https_compatible)
    TCP RST, a TLS alert, a broken record   -> RST
    close_notify, then the TCP close        <- FIN  (TLS has no half-close that HTTPS clients
                                                     honour: TLS 1.2 answers close_notify with
                                                     close_notify and a close, RFC 5246 §7.2.1)
    TCP RST, no close_notify (a truncation  <- RST
    the peer can tell from a clean end)
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
import os
import socket
import ssl
import struct
import tempfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import trio

from middlebox.scenario.model import TlsOptions

READ_SIZE = 64 * 1024
# How long a client gets to finish its TLS handshake: nginx's client_header_timeout also
# bounds the handshake (ngx_http_ssl_handshake reuses it), 60 s by default.
HANDSHAKE_TIMEOUT = 60.0
CA_VALIDITY = datetime.timedelta(days=3650)
LEAF_VALIDITY = datetime.timedelta(days=365)
_LINGER_ABORT = struct.pack("ii", 1, 0)


def default_ca_dir() -> Path:
    """$MIDDLEBOX_CA_DIR, else $XDG_DATA_HOME/middlebox/ca (~/.local/share/middlebox/ca):
    one CA that a browser or the system store can trust once, across runs."""
    explicit = os.environ.get("MIDDLEBOX_CA_DIR")
    if explicit:
        return Path(explicit)
    data = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data) / "middlebox" / "ca"


@dataclass(frozen=True)
class LocalCA:
    """middlebox's own certificate authority: `cert_path` is what clients trust."""

    directory: Path

    @property
    def cert_path(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def key_path(self) -> Path:
        return self.directory / "ca-key.pem"

    @classmethod
    def load_or_create(cls, directory: Path | str | None = None) -> LocalCA:
        """The CA in `directory`, created on first use (under a lock, so two proxies
        starting at once agree on one CA)."""
        ca = cls(Path(directory) if directory is not None else default_ca_dir())
        ca.directory.mkdir(parents=True, exist_ok=True)
        with open(ca.directory / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (ca.cert_path.exists() and ca.key_path.exists()):
                ca._create()
        return ca

    def _create(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "middlebox local CA")])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + CA_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        _write_private(self.key_path, key_pem)
        _write_private(self.cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)

    def issue(self, hostnames: Sequence[str]) -> tuple[bytes, bytes]:
        """A fresh server certificate (PEM, with the CA after it) and its key for
        `hostnames` (DNS names or IP addresses, all in subjectAltName: RFC 6125 §6.4.4,
        browsers ignore the common name)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        ca_cert = x509.load_pem_x509_certificate(self.cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(self.key_path.read_bytes(), password=None)
        if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
            raise ValueError(f"{self.key_path}: not the EC key middlebox writes")
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hostnames:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostnames[0])]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + LEAF_VALIDITY)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        chain = cert.public_bytes(serialization.Encoding.PEM) + self.cert_path.read_bytes()
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return chain, key_pem


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Written aside and renamed, so a reader never sees half a PEM file."""
    aside = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    aside.replace(path)


def server_context(options: TlsOptions, ca: LocalCA | None = None) -> ssl.SSLContext:
    """The client-facing context: a certificate from the local CA, ALPN as configured."""
    ca = ca or LocalCA.load_or_create(options.ca_dir)
    chain, key = ca.issue(options.hostnames)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # load_cert_chain reads files only: the leaf lives on disk for the call, mode 0600.
    with tempfile.TemporaryDirectory(prefix="middlebox-tls-") as scratch:
        cert_file, key_file = Path(scratch) / "leaf.pem", Path(scratch) / "leaf-key.pem"
        _write_private(cert_file, chain)
        _write_private(key_file, key)
        context.load_cert_chain(cert_file, key_file)
    context.set_alpn_protocols(list(options.alpn))
    if "http/1.1" not in options.alpn:
        _ONLY_ALPN[context] = tuple(options.alpn)
    _log_keys(context)
    return context


# Contexts whose ALPN list leaves HTTP/1.1 out (`alpn: [h2]`): a client that picks none of
# their protocols is refused after the handshake (see `handshake`).
_ONLY_ALPN: weakref.WeakKeyDictionary[ssl.SSLContext, tuple[str, ...]] = weakref.WeakKeyDictionary()


def _log_keys(context: ssl.SSLContext) -> None:
    """SSLKEYLOGFILE (`proxy --tls-keylog`): the session keys as NSS key log lines, so
    Wireshark decrypts a real capture into the HTTP/2 frames or HTTP/1.1 bytes the relay
    saw. Set here rather than left to create_default_context's own reading of it, which
    `sys.flags.ignore_environment` (python -E) turns off."""
    keylog = os.environ.get("SSLKEYLOGFILE")
    if keylog:
        context.keylog_filename = keylog


def upstream_context(*, insecure: bool = False, cafile: str | None = None) -> ssl.SSLContext:
    """The upstream-facing context: the system's trust store (plus `cafile`), hostname
    checked, unless `insecure` (nginx's default `proxy_ssl_verify off`; curl's -k).
    ALPN offers http/1.1 only: each upstream exchange is HTTP/1.1 (docs/tls-http2.md)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cafile)
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["http/1.1"])
    _log_keys(context)
    return context


def loopback_pair() -> tuple[socket.socket, socket.socket]:
    """Two connected non-blocking TCP sockets on 127.0.0.1: (relay's end, splice's end).
    The listener lives for one accept and takes only the connection we made (its peer
    address is our own socket's), so nothing else on the host can slip in."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        ours = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            ours.connect(listener.getsockname())
            while True:
                theirs, peer = listener.accept()
                if peer == ours.getsockname():
                    break
                theirs.close()  # a stranger raced to our ephemeral port
        except BaseException:
            ours.close()
            raise
    for sock in (ours, theirs):
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return theirs, ours


def _abort_transport(stream: trio.abc.Stream) -> None:
    """Arm an RST on the TCP socket under `stream` (SO_LINGER 0), for the close after it."""
    while isinstance(stream, trio.SSLStream):
        stream = stream.transport_stream
    if isinstance(stream, trio.SocketStream):
        try:
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ABORT)
        except OSError:
            pass


async def splice(tls: trio.SSLStream[trio.SocketStream], raw: socket.socket) -> None:
    """Carry bytes between a TLS stream and the splice's end of a loopback pair until
    both ends are over, mapping FIN and RST as the module docstring says. Closes both."""
    bridge = trio.SocketStream(trio.socket.from_stdlib_socket(raw))
    async with trio.open_nursery() as nursery:

        async def reset_both() -> None:
            _abort_transport(tls)
            _abort_transport(bridge)
            nursery.cancel_scope.cancel()

        async def from_tls() -> None:
            while True:
                try:
                    data = await tls.receive_some(READ_SIZE)
                except trio.ClosedResourceError:
                    break  # we closed it after the relay's FIN: the connection is over
                except (trio.BrokenResourceError, ssl.SSLError, OSError):
                    await reset_both()
                    return
                if not data:
                    break
                try:
                    await bridge.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await reset_both()  # the relay reset its end: the TLS peer gets one too
                    return
            try:
                await bridge.send_eof()
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        async def to_tls() -> None:
            while True:
                try:
                    data = await bridge.receive_some(READ_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await reset_both()
                    return
                if not data:
                    break
                try:
                    await tls.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
                    await reset_both()
                    return
            # The relay's FIN: close_notify, then the TCP close (module docstring).
            with trio.move_on_after(HANDSHAKE_TIMEOUT) as cleanup:
                cleanup.shield = True
                try:
                    await tls.aclose()
                except (trio.BrokenResourceError, trio.ClosedResourceError, ssl.SSLError):
                    pass

        nursery.start_soon(from_tls)
        nursery.start_soon(to_tls)
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(tls)
        await trio.aclose_forcefully(bridge)


async def handshake(
    sock: socket.socket, context: ssl.SSLContext, *, server_hostname: str | None = None
) -> trio.SSLStream[trio.SocketStream]:
    """Wrap a connected stdlib socket in TLS and complete the handshake (either side:
    `server_hostname` makes it the client). The caller bounds it with a cancel scope."""
    transport = trio.SocketStream(trio.socket.from_stdlib_socket(sock))
    stream = trio.SSLStream(
        transport,
        context,
        server_side=server_hostname is None,
        server_hostname=server_hostname,
        # A TCP FIN without close_notify is an EOF, as browsers and curl take it.
        https_compatible=True,
    )
    try:
        await stream.do_handshake()
        only = _ONLY_ALPN.get(context)
        if only is not None and stream.selected_alpn_protocol() not in only:
            # OpenSSL completes a handshake without ALPN when nothing overlaps (the server
            # callback answers NOACK), which would serve HTTP/1.1 on an h2-only path and pass
            # its HTTP/2 faults by: fail closed instead (RFC 7301 §3.2's
            # no_application_protocol, as a failed handshake).
            raise ssl.SSLError(f"no application protocol: the client offered none of {only}")
    except BaseException:
        _abort_transport(stream)
        await trio.aclose_forcefully(transport)
        raise
    return stream


def negotiated(stream: trio.SSLStream[trio.SocketStream]) -> str:
    """The ALPN protocol the client picked; without ALPN, HTTP/1.1 (RFC 7301 §3.2)."""
    return stream.selected_alpn_protocol() or "http/1.1"
