"""A scripted HTTP/1.1 server that writes exact bytes, for testing clients on real sockets.

Each request's `model` names a behaviour: a function that writes the response (or a cut
one) on the raw socket. The server counts attempts per behaviour and logs every request
with its headers and arrival time, so tests can assert what clients sent and when.
Responses copy vLLM 0.33.0 (vllm-wire.md §1.2, §5): chunked `text/event-stream`, one
HTTP chunk per `data:` frame, no Connection header, keep-alive after a complete body.
"""

from __future__ import annotations

import json
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CHAT_ID = "chatcmpl-8c1e6f0a3b2d4e95"
MODEL = "Qwen/Qwen3-0.6B"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Sun, 29 Nov 2026 07:02:39 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n"
)
END_CHUNK = b"0\r\n\r\n"


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def chat_frame(content: str | None, finish: str | None = None, *, role: bool = False) -> bytes:
    """One vLLM 0.33.0 chat chunk as `data: {...}\\n\\n` (compact JSON, raw UTF-8)."""
    delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {"content": content}
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    if finish is not None:
        choice["stop_reason"] = None
    obj = {
        "id": CHAT_ID,
        "object": "chat.completion.chunk",
        "created": 1764400000,
        "model": MODEL,
        "choices": [choice],
    }
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def text_frame(text: str, finish: str | None = None) -> bytes:
    """One vLLM 0.33.0 /v1/completions chunk."""
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    obj: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": MODEL,
    }
    obj["choices"] = [choice]
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


USAGE_FRAME = (
    b'data: {"id":"'
    + CHAT_ID.encode()
    + b'","object":"chat.completion.chunk","created":1764400000,'
    b'"model":"' + MODEL.encode() + b'","choices":[],'
    b'"usage":{"prompt_tokens":12,"total_tokens":17,"completion_tokens":5}}\n\n'
)
DONE_FRAME = b"data: [DONE]\n\n"

HELLO = ["Hello", ",", " world", "!"]
HELLO_FRAMES = [
    chat_frame(None, role=True),
    *(chat_frame(p, "stop" if i == len(HELLO) - 1 else None) for i, p in enumerate(HELLO)),
    USAGE_FRAME,
    DONE_FRAME,
]


@dataclass
class Seen:
    """One request as the server received it."""

    behaviour: str
    attempt: int
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


class Conn:
    """The server side of one response: exact writes, FIN, RST, waiting for the peer."""

    def __init__(self, sock: socket.socket, server: WireServer, behaviour: str) -> None:
        self.sock = sock
        self.server = server
        self.behaviour = behaviour

    def write(self, data: bytes) -> bool:
        """Send now (TCP_NODELAY); False once the client has gone (EPIPE/ECONNRESET)."""
        try:
            self.sock.sendall(data)
            return True
        except OSError:
            return False

    def chunks(self, frames: list[bytes], gap: float = 0.0) -> bool:
        for frame in frames:
            if not self.write(http_chunk(frame)):
                return False
            if gap:
                time.sleep(gap)
        return True

    def fin(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def rst(self) -> None:
        # SO_LINGER {on, 0 s} makes close() send an RST instead of a FIN.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def wait_for_client_close(self, limit: float) -> float | None:
        """Block until the client closes (EOF or RST); returns when, or None at `limit`."""
        deadline = time.monotonic() + limit
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.sock], [], [], left)
            if ready:
                try:
                    if not self.sock.recv(65536):
                        return time.time()
                except OSError:
                    return time.time()
        return None

    def note(self, **facts: Any) -> None:
        with self.server.noted:
            self.server.notes.setdefault(self.behaviour, []).append(facts)
            self.server.noted.notify_all()


Behaviour = Callable[[Conn, int, dict[str, str]], bool]
"""Writes a response for attempt N given the request headers; True keeps the connection."""


@dataclass
class WireServer:
    behaviours: dict[str, Behaviour]
    seen: list[Seen] = field(default_factory=list)
    notes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    noted: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._attempts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1"

    def first_note(self, behaviour: str, limit: float = 5.0) -> dict[str, Any]:
        """What the behaviour noted on its first connection. The client may exit before
        the server's thread has seen it go, so this waits, boundedly."""
        with self.noted:
            assert self.noted.wait_for(lambda: behaviour in self.notes, limit), behaviour
            return self.notes[behaviour][0]

    def requests_for(self, behaviour: str) -> list[Seen]:
        return [s for s in self.seen if s.behaviour == behaviour]

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            t = threading.Thread(target=self._serve, args=(sock,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, sock: socket.socket) -> None:
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {}
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0"))
                while len(buffer) < length:
                    data = sock.recv(65536)
                    if not data:
                        return
                    buffer += data
                body, buffer = json.loads(buffer[:length]), buffer[length:]
                name = str(body.get("model"))
                with self._lock:
                    attempt = self._attempts[name] = self._attempts.get(name, 0) + 1
                    path = lines[0].split(" ")[1]
                    self.seen.append(Seen(name, attempt, path, headers, body, time.time()))
                if not self.behaviours[name](Conn(sock, self, name), attempt, headers):
                    return
        except OSError:
            return
        finally:
            sock.close()
