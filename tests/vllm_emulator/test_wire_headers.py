"""The profile's middleware headers on the wire: vLLM 0.32's `vary: Origin` on every response.

Header names in order as a raw client reads them, compared with what the real vLLM 0.32.0 sent
(tests/real_vllm/ and shared/reference/vllm-0.32-captures/chat-stream-usage.txt).
"""

from __future__ import annotations

import http.client
import json
from typing import Any

from vllm_emulator import wire

MODEL = "middlebox/emulated-7b"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def _names(port: int, method: str, path: str, body: bytes | None = None) -> list[str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    response.read()
    conn.close()
    return [name.lower() for name, _ in response.getheaders()]


def test_only_the_032_profile_adds_vary_origin() -> None:
    assert wire.middleware_headers("vllm-0.32") == (("vary", "Origin"),)
    assert wire.middleware_headers("vllm-0.33") == ()
    assert wire.middleware_headers("vllm-0.11") == ()


def test_032_sends_vary_after_content_type_and_before_transfer_encoding(emulator: Any) -> None:
    server = emulator(profile="vllm-0.32")
    stream = json.dumps({**CHAT, "stream": True}).encode()
    plain = json.dumps(CHAT).encode()
    unknown = json.dumps({**CHAT, "model": "nope"}).encode()
    assert _names(server.port, "POST", "/v1/chat/completions", stream) == [
        "date", "server", "content-type", "vary", "transfer-encoding"
    ]  # fmt: skip
    json_names = ["date", "server", "content-length", "content-type", "vary"]
    assert _names(server.port, "POST", "/v1/chat/completions", plain) == json_names
    assert _names(server.port, "POST", "/v1/completions", unknown) == json_names
    assert _names(server.port, "GET", "/v1/models") == json_names
    assert _names(server.port, "GET", "/version") == json_names
    assert _names(server.port, "GET", "/health") == ["date", "server", "content-length", "vary"]


def test_033_sends_no_vary(emulator: Any) -> None:
    server = emulator(profile="vllm-0.33")
    stream = json.dumps({**CHAT, "stream": True}).encode()
    assert "vary" not in _names(server.port, "POST", "/v1/chat/completions", stream)
    assert "vary" not in _names(server.port, "GET", "/health")
