"""The HTTP faults on real sockets: what the OpenAI SDK sees through the proxy.

An upstream on 127.0.0.1 speaks like vLLM behind uvicorn (chunked SSE, one frame per
chunk, keep-alive); the SDK runs in a worker thread against the proxy, with no retries,
and everything is bounded in time.
"""

from __future__ import annotations

import json

import openai
import trio

from faults import REGISTRY
from middlebox.core.http1 import Http1Framer, encode_chunk
from middlebox.scenario.load import load_scenario_text
from tests.faults.httpprops import SSE_HEAD, request, sse_chunks
from tests.harness import proxied, read_all


def chat_frames(count: int) -> list[bytes]:
    """vLLM 0.33 chat chunks carrying `tok0`..., then [DONE] and the last chunk."""
    body = []
    for i in range(count):
        chunk = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
        }
        body.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    return body


class Upstream:
    """Answers every request on a connection with a short chat stream; counts them."""

    def __init__(self) -> None:
        self.requests = 0

    async def __call__(self, stream: trio.SocketStream) -> None:
        framer = Http1Framer("request")
        with trio.move_on_after(10):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    return
                for piece in framer.feed(data):
                    if piece.end_of_message:
                        self.requests += 1
                        await stream.send_all(SSE_HEAD)
                        for frame in chat_frames(4):
                            await stream.send_all(encode_chunk(frame))
                            await trio.sleep(0.01)
                        await stream.send_all(b"".join(sse_chunks(0)))


def chat(port: int) -> list[str] | Exception:
    """Stream one chat completion with the SDK; the text pieces, or the exception."""
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    try:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], stream=True, timeout=5
        )
        return [c.choices[0].delta.content or "" for c in stream if c.choices]
    except Exception as error:  # the test inspects which one
        return error
    finally:
        client.close()


async def test_the_sdk_gets_a_rate_limit_error_then_the_next_request_streams() -> None:
    upstream = Upstream()
    scenario = load_scenario_text(
        "name: rl\npath:\n  - http_error: {status: 429, retry_after: 1s, match: {first: 1}}\n",
        REGISTRY,
    )
    with trio.fail_after(15):
        async with proxied(upstream, scenario) as running:
            first = await trio.to_thread.run_sync(chat, running.proxy_port)
            second = await trio.to_thread.run_sync(chat, running.proxy_port)
    assert isinstance(first, openai.RateLimitError)
    assert first.code == "rate_limit_exceeded"
    assert first.response.headers["retry-after"] == "1"
    assert second == ["tok0 ", "tok1 ", "tok2 ", "tok3 "]
    assert upstream.requests == 1


async def test_the_sdk_raises_on_the_in_band_error_after_two_tokens() -> None:
    upstream = Upstream()
    scenario = load_scenario_text(
        "name: ib\npath:\n  - inband_error: {events: 2}\n  - sse_ids: {mode: add}\n", REGISTRY
    )
    seen: list[str] = []

    def consume(port: int) -> Exception | None:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
        try:
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}], stream=True, timeout=5
            )
            for c in stream:
                seen.append(c.choices[0].delta.content or "")
        except openai.APIError as error:
            return error
        finally:
            client.close()
        return None

    with trio.fail_after(15):
        async with proxied(upstream, scenario) as running:
            error = await trio.to_thread.run_sync(consume, running.proxy_port)
    assert seen == ["tok0 ", "tok1 "]
    assert isinstance(error, openai.APIError) and error.message == "Internal server error"


async def test_a_closing_503_reaches_the_client_then_a_fin_and_the_server_sees_nothing() -> None:
    upstream = Upstream()
    scenario = load_scenario_text(
        "name: c\npath:\n  - http_error: {status: 503, body: vllm, connection: close}\n", REGISTRY
    )
    with trio.fail_after(10):
        async with proxied(upstream, scenario) as running:
            client = await running.connect()
            await client.send_all(request())
            data, end = await read_all(client)
    assert data.startswith(b"HTTP/1.1 503 Service Unavailable\r\nServer: uvicorn\r\n")
    assert b"Connection: close\r\n" in data and data.endswith(b'"code":503}}')
    assert end == "fin" and upstream.requests == 0


async def test_a_pipelined_request_after_a_half_close_gets_no_answer_behind_a_cut_stream() -> None:
    # A client pipelines two chats and half-closes; the server starts the first stream and,
    # seeing the client's FIN (carried by the proxy), aborts it and closes, as vLLM does on
    # a disconnect. `http_error` matches the second: its 429 must not follow the cut 200.
    async def aborting(stream: trio.SocketStream) -> None:
        with trio.move_on_after(10):
            framer = Http1Framer("request")
            started = False
            while data := await stream.receive_some(65536):
                if not started and any(p.end_of_message for p in framer.feed(data)):
                    await stream.send_all(SSE_HEAD)
                    started = True
            await stream.aclose()

    scenario = load_scenario_text(
        "name: rl\npath:\n  - http_error: {status: 429, match: {requests: [1]}}\n", REGISTRY
    )
    with trio.fail_after(15):
        async with proxied(aborting, scenario) as run:
            client = await run.connect()
            await client.send_all(request() + request())
            await client.send_eof()
            received, ended = await read_all(client)
    assert received == SSE_HEAD and ended == "fin"
