"""The decrypted view of an HTTP/2 connection: `proxy --tls-keylog FILE`
(SSLKEYLOGFILE) writes the TLS session keys, and tshark with that key log decrypts a capture
of the client's connection into the HTTP/2 HEADERS and DATA frames the proxy sent.

The capture is made by a recording forwarder between the client and the proxy (no root, no
capture interface): its bytes become TCP segments (scapy), read back by tshark.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

from middlebox.scenario.model import TlsOptions
from middlebox.shell.tls import LocalCA
from tests.harness import needs, proxied
from tests.shell.test_h2_streams import SSE, H2Client, Seen, streaming_upstream

CLIENT_PORT, PROXY_PORT = 40001, 9443  # the ports written into the capture


async def record_between(
    listener: trio.SocketListener, proxy_port: int, seen: list[tuple[str, bytes]]
) -> None:
    """Forward one client connection to the proxy, noting each read: ("up"|"down", bytes)."""
    client = await listener.accept()
    proxy = await trio.open_tcp_stream("127.0.0.1", proxy_port)

    async def copy(source: trio.SocketStream, sink: trio.SocketStream, side: str) -> None:
        try:
            while data := await source.receive_some(65536):
                seen.append((side, bytes(data)))
                await sink.send_all(data)
            await sink.send_eof()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async with client, proxy, trio.open_nursery() as nursery:
        nursery.start_soon(copy, client, proxy, "up")
        nursery.start_soon(copy, proxy, client, "down")


def write_capture(path: Path, seen: list[tuple[str, bytes]]) -> None:
    """One TCP connection on 127.0.0.1, client CLIENT_PORT -> proxy PROXY_PORT."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    ports = {"up": (CLIENT_PORT, PROXY_PORT), "down": (PROXY_PORT, CLIENT_PORT)}
    seq = {"up": 1001, "down": 5001}

    def segment(side: str, flags: str, payload: bytes = b"") -> Any:
        other = "down" if side == "up" else "up"
        sport, dport = ports[side]
        tcp = TCP(sport=sport, dport=dport, flags=flags, seq=seq[side], ack=seq[other])
        packet = Ether() / IP(src="127.0.0.1", dst="127.0.0.1") / tcp / payload
        seq[side] += len(payload) + (1 if "S" in flags or "F" in flags else 0)
        return packet

    packets = [segment("up", "S"), segment("down", "SA"), segment("up", "A")]
    for side, data in seen:
        for start in range(0, len(data), 16384):
            packets.append(segment(side, "PA", data[start : start + 16384]))
    wrpcap(str(path), packets)


def tshark_fields(capture: Path, keylog: Path, *fields: str) -> list[list[str]]:
    tshark = shutil.which("tshark")
    assert tshark is not None
    argv = [tshark, "-n", "-r", str(capture), "-o", f"tls.keylog_file:{keylog}"]
    argv += ["-d", f"tcp.port=={PROXY_PORT},tls", "-Y", "http2", "-T", "fields"]
    argv += ["-E", "occurrence=a", "-E", "aggregator=|"]
    for name in fields:
        argv += ["-e", name]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=True)
    return [line.split("\t") for line in done.stdout.splitlines()]


@needs(shutil.which("tshark"), "tshark")
async def test_a_key_log_lets_tshark_decrypt_the_http2_frames_of_a_capture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    keylog = tmp_path / "keys.log"
    monkeypatch.setenv("SSLKEYLOGFILE", str(keylog))  # what --tls-keylog sets
    ca = LocalCA.load_or_create(tmp_path)
    seen_upstream, seen = Seen(), list[tuple[str, bytes]]()
    with trio.fail_after(20):
        async with proxied(
            streaming_upstream(seen_upstream), tls=TlsOptions(ca_dir=str(tmp_path))
        ) as running:
            listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
            port = listeners[0].socket.getsockname()[1]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(record_between, listeners[0], running.proxy_port, seen)
                client = await H2Client.connect(port, ca)
                stream_id = await client.post("/decrypted")
                await client.until(client.all_over)
                await client.stream.aclose()
    assert client.answers[stream_id].data == SSE + b"POST /decrypted HTTP/1.1"
    lines = keylog.read_text().splitlines()
    # TLS 1.3's NSS key log labels (the server's and client's traffic secrets)
    assert any(line.startswith("SERVER_TRAFFIC_SECRET_0 ") for line in lines)
    capture = tmp_path / "h2.pcap"
    write_capture(capture, seen)
    rows = tshark_fields(capture, keylog, "http2.type", "http2.streamid", "http2.data.data")
    kinds = {
        pair for row in rows for pair in zip(row[0].split("|"), row[1].split("|"), strict=True)
    }
    assert ("1", str(stream_id)) in kinds  # HEADERS both ways on the stream
    assert ("0", str(stream_id)) in kinds  # DATA
    payload = bytes.fromhex("".join(row[2].replace("|", "").replace(":", "") for row in rows))
    assert SSE in payload  # the decrypted DATA is the answer the client got
    without_keys = tshark_fields(capture, tmp_path / "no-such-keys.log", "http2.type")
    assert without_keys == []  # the frames come from the key log, not from cleartext


def test_the_proxy_option_sets_the_key_log_for_every_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from middlebox.cli import proxy as proxy_command

    monkeypatch.delenv("SSLKEYLOGFILE", raising=False)
    seen_env: list[str | None] = []

    def serve(settings: object, show: object, drill: object = None) -> str:
        seen_env.append(os.environ.get("SSLKEYLOGFILE"))
        return "done"

    monkeypatch.setattr("middlebox.run.serve.serve", serve)
    keys = tmp_path / "keys.log"
    result = CliRunner().invoke(
        proxy_command.proxy,
        ["--upstream", "http://127.0.0.1:1", "--tls", "--tls-keylog", str(keys)],
    )
    assert result.exit_code == 0, result.output
    assert seen_env == [str(keys.resolve())]
