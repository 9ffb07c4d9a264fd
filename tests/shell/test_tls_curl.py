"""curl streams an emulator SSE response through the TLS proxy.

`curl --http2 -N` (trusting middlebox's CA, or -k) over HTTP/2 and HTTP/1.1, payload
byte-exact against what the emulator sent on the upstream leg (de-chunked by the passive
framer); then `middlebox proxy --tls` itself, whose banner names the CA file to trust.
Real processes, bounded by timeouts.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from middlebox.compose import PROXY_STAGES
from middlebox.core.http1 import Http1Framer, PieceKind
from middlebox.core.stream import Direction
from middlebox.run.processes import EmulatorProcess
from middlebox.scenario.model import Scenario, TlsOptions
from middlebox.shell.server import Address, ProxyConfig, ProxyServer, listen
from middlebox.shell.tls import LocalCA
from tests.harness import needs
from tests.proxy_process import stop

CURL = shutil.which("curl")
pytestmark = needs(CURL, "curl")
BODY = json.dumps(
    {
        "model": "middlebox/emulated-7b",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 12,
    }
)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorProcess]:
    process = EmulatorProcess({}, tmp_path_factory.mktemp("emulator"))
    try:
        yield process
    finally:
        process.stop()


def curl_argv(url: str, *options: str) -> list[str]:
    assert CURL is not None
    return [CURL, "-sS", "-N", "--max-time", "20", *options, f"{url}/v1/chat/completions",
            "-H", "Content-Type: application/json", "-d", BODY]  # fmt: skip


def dechunked(wire: bytes) -> bytes:
    framer = Http1Framer("response")
    framer.expect_response_to("POST")
    pieces = framer.feed(wire) + framer.feed_eof()
    return b"".join(p.data for p in pieces if p.kind is PieceKind.BODY)


class UpstreamBytes:
    """An observer keeping what the relay read from the upstream."""

    def __init__(self, sink: list[bytes]) -> None:
        self.sink = sink

    def read(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        if leg == "upstream":
            self.sink.append(data)

    def wrote(self, leg: str, direction: Direction, data: bytes, now: float) -> None:
        pass

    def ended(self, leg: str, direction: Direction, kind: str, now: float) -> None:
        pass


@pytest.mark.parametrize(
    ("options", "protocol"),
    [
        (("--http2",), "HTTP/2"),
        (("--http2", "-k"), "HTTP/2"),
        (("--http1.1",), "HTTP/1.1"),
    ],
)
async def test_curl_streams_an_emulator_sse_response_byte_exact_through_the_tls_proxy(
    emulator: EmulatorProcess, tmp_path: Path, options: tuple[str, ...], protocol: str
) -> None:
    upstream_reads: list[bytes] = []
    ca = LocalCA.load_or_create(tmp_path)
    config = ProxyConfig(
        Address.parse(emulator.url),
        Scenario(name="tls"),
        stages=PROXY_STAGES,
        tls=TlsOptions(ca_dir=str(tmp_path)),
        observer_factory=lambda _cid, _s: UpstreamBytes(upstream_reads),
    )
    server = ProxyServer(config)
    trust = () if "-k" in options else ("--cacert", str(ca.cert_path))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listener = listen(Address("127.0.0.1", 0))
            port = await nursery.start(server.serve, listener)
            argv = curl_argv(f"https://127.0.0.1:{port}", *options, *trust, "-w", "%{http_version}")
            done = await trio.run_process(argv, capture_stdout=True, capture_stderr=True)
            while server.active:  # the upstream leg is over once the relay is
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
            listener.close()
    version = {"HTTP/2": b"2", "HTTP/1.1": b"1.1"}[protocol]
    assert done.stdout.endswith(version)
    payload = done.stdout[: -len(version)]
    assert payload.endswith(b"data: [DONE]\n\n")
    assert payload == dechunked(b"".join(upstream_reads))


def test_middlebox_proxy_tls_names_its_ca_and_curl_http2_trusts_it(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "middlebox", "proxy", "--tls",
            "--ca-dir", str(tmp_path / "ca"), "--listen", "127.0.0.1:0",
            "--upstream", emulator.url, "--ready-file", str(ready)]  # fmt: skip
    proxy = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not ready.exists():
            assert proxy.poll() is None, proxy.stderr.read() if proxy.stderr else b""
            assert time.monotonic() < deadline, "the proxy never became ready"
            time.sleep(0.05)
        banner = ready.read_text().strip()
        assert banner.startswith("listening on https://127.0.0.1:")
        ca_file = tmp_path / "ca" / "ca.pem"
        assert f"TLS CA: {ca_file}" in banner
        port = banner.split("https://127.0.0.1:")[1].split()[0]
        done = subprocess.run(
            curl_argv(f"https://127.0.0.1:{port}", "--http2", "--cacert", str(ca_file), "-v"),
            capture_output=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        assert b"ALPN: server accepted h2" in done.stderr
        events = [e for e in done.stdout.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]"
        assert len(events) >= 12  # role, the tokens, finish, usage and [DONE]
    finally:
        stop(proxy, bound=15)
    assert proxy.returncode == 0


def test_tls_with_two_workers_serves_curl_http2_from_one_ca_and_counts_every_connection(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    """`--tls --workers 2`: each worker issues its certificate from the one CA the banner
    names, so curl trusting that file gets every answer over h2, and the supervisor's
    stop line counts each TLS connection and each stream's relay once (3 + 3)."""
    ready = tmp_path / "ready"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    ca_file = tmp_path / "ca" / "ca.pem"
    argv = [sys.executable, "-m", "middlebox", "proxy", "--tls", "--workers", "2",
            "--ca-dir", str(tmp_path / "ca"), "--listen", "127.0.0.1:0",
            "--upstream", emulator.url, "--ready-file", str(ready)]  # fmt: skip
    proxy = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() or not ready.read_text().strip():
            assert proxy.poll() is None, proxy.stdout.read() if proxy.stdout else b""
            assert time.monotonic() < deadline, "the proxy never became ready"
            time.sleep(0.05)
        banner = ready.read_text().strip()
        assert f"TLS CA: {ca_file}" in banner
        port = banner.split("https://127.0.0.1:")[1].split()[0]
        for _ in range(3):
            done = subprocess.run(
                curl_argv(f"https://127.0.0.1:{port}", "--http2", "--cacert", str(ca_file),
                          "-w", "%{http_version}"),
                capture_output=True,
                timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr
            assert done.stdout.endswith(b"data: [DONE]\n\n2")
    finally:
        output = (stop(proxy, bound=20) or b"").decode()
    assert proxy.returncode == 0, output
    assert "stopped: connections accepted: 6 " in output, output


async def test_httpx_with_http2_and_the_openai_sdk_on_it_stream_through_the_tls_proxy(
    emulator: EmulatorProcess, tmp_path: Path
) -> None:
    import httpx
    import openai

    ca = LocalCA.load_or_create(tmp_path)
    config = ProxyConfig(
        Address.parse(emulator.url),
        Scenario(name="tls"),
        stages=PROXY_STAGES,
        tls=TlsOptions(ca_dir=str(tmp_path)),
    )
    server = ProxyServer(config)

    def ask(port: int) -> tuple[str, str, str]:
        url = f"https://127.0.0.1:{port}"
        trust = ssl.create_default_context(cafile=str(ca.cert_path))
        with httpx.Client(http2=True, verify=trust, timeout=20) as http:
            with http.stream(
                "POST", f"{url}/v1/chat/completions", content=BODY,
                headers={"Content-Type": "application/json"},
            ) as response:  # fmt: skip
                raw = b"".join(response.iter_bytes())
                version = response.http_version
            client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", http_client=http)
            stream = client.chat.completions.create(
                model="middlebox/emulated-7b",
                messages=[{"role": "user", "content": "hi"}],
                stream=True,
                max_tokens=12,
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        return version, raw.decode(), text

    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            listener = listen(Address("127.0.0.1", 0))
            port = await nursery.start(server.serve, listener)
            version, raw, text = await trio.to_thread.run_sync(ask, port)
            nursery.cancel_scope.cancel()
            listener.close()
    assert version == "HTTP/2"
    assert raw.endswith("data: [DONE]\n\n")
    assert text  # the SDK parsed the streamed answer over HTTP/2
    assert server.connections_accepted >= 3  # one TLS connection, one per stream
