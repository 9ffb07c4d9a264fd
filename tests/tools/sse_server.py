"""A tiny streaming chat-completions server for the load tools' tests (127.0.0.1 only).

Answers every POST with vLLM-shaped chunks: a role-only first chunk, `TOKENS` content
chunks `GAP` seconds apart, a finish chunk and `[DONE]`, chunked, then closes; any
other path gets a 404.
"""

from __future__ import annotations

import json

import trio

TOKENS = 5
GAP = 0.005


def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    obj = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    if finish:
        obj["choices"][0]["finish_reason"] = finish  # type: ignore[index]
    data = f"data: {json.dumps(obj)}\n\n".encode()
    return b"%x\r\n%s\r\n" % (len(data), data)


async def read_request(stream: trio.SocketStream) -> bytes:
    received = b""
    while b"\r\n\r\n" not in received:
        data = await stream.receive_some(65536)
        if not data:
            return received
        received += data
    head, _, body = received.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head


async def chat_server(stream: trio.SocketStream) -> None:
    head = await read_request(stream)
    try:
        if not head.startswith(b"POST /v1/chat/completions "):
            await stream.send_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            return
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + chunk({"role": "assistant"})
        )
        for n in range(TOKENS):
            await trio.sleep(GAP)
            await stream.send_all(chunk({"content": f"tok{n} "}))
        data = b"data: [DONE]\n\n"
        await stream.send_all(
            chunk({}, finish="stop") + b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
        )
    except trio.BrokenResourceError:
        pass  # the client left; nothing to finish
    finally:
        await stream.aclose()
