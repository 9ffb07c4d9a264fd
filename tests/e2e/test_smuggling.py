"""Smuggling and bypasses through the real proxy to the real emulator: each
gets nginx's answer and the emulator's ledger shows nothing generated."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from middlebox.compose import load
from middlebox.run.background import BackgroundProxy
from middlebox.run.processes import EmulatorProcess
from middlebox.run.upstream import UpstreamClient

SCENARIO = """\
name: smuggling
path:
  - http_error: {status: 429, match: {path: /v1/chat/completions}}
"""


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BackgroundProxy, str]]:
    directory: Path = tmp_path_factory.mktemp("smuggling")
    (directory / "smuggling.yaml").write_text(SCENARIO)
    emulator = EmulatorProcess({}, directory)
    try:
        model = UpstreamClient(emulator.url).model()
        background = BackgroundProxy(load(directory / "smuggling.yaml"), emulator.url, emulator)
        try:
            yield background, model
        finally:
            background.close()
    finally:
        emulator.stop()


def chat(model: str, target: str = "/v1/chat/completions") -> bytes:
    body = json.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    head = f"POST {target} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def exchange(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def cases(model: str) -> dict[str, tuple[bytes, bytes]]:
    smuggle = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n\r\n"
    )
    spaced = b"POST  /v1/chat/completions HTTP/1.1\r\nHost: a\r\n\r\n"
    connect = b"CONNECT x:443 HTTP/1.1\r\nHost: x:443\r\n\r\n"
    return {
        "smuggled in a chunked body": (smuggle + chat(model), b"HTTP/1.1 400 "),
        "double space": (spaced + chat(model), b"HTTP/1.1 400 "),
        "CONNECT then a chat": (connect + chat(model), b"HTTP/1.1 405 "),
    }


@pytest.mark.parametrize(
    "case", ["smuggled in a chunked body", "double space", "CONNECT then a chat"]
)
def test_a_bypass_gets_nginx_s_answer_and_nothing_is_generated(
    proxy: tuple[BackgroundProxy, str], case: str
) -> None:
    background, model = proxy
    before = len(background.upstream.ledger())
    data, status = cases(model)[case]
    answer = exchange(background.url, data)
    assert answer.startswith(status) and b"Connection: close" in answer
    assert answer.count(b"HTTP/1.1 ") == 1  # no second response: the chat went nowhere
    background.settle()
    assert len(background.upstream.ledger()) == before


def test_an_encoded_chat_path_is_matched_by_the_fault(proxy: tuple[BackgroundProxy, str]) -> None:
    background, model = proxy
    before = len(background.upstream.ledger())
    data = chat(model, "/v1/chat/%63ompletions")
    answer = exchange(
        background.url, data.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n", 1)
    )
    assert answer.startswith(b"HTTP/1.1 429 ")
    background.settle()
    assert len(background.upstream.ledger()) == before
