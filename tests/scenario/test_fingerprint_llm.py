"""The measures against a real LLM server, on the virtual clock: a vLLM-like token stream
(one SSE event per token, chunked, a token every 30 ms) is replayed through a path of faults
(`faults.testing.replay`) and the client's side measured; /metrics samples are synthesized.
Each diagnosis line has a case where it must appear and one where it must not."""

from __future__ import annotations

import json
from typing import Any

from faults.gzip_encoding import GzipEncoding
from faults.proxy_buffering import ProxyBuffering
from faults.set_header import SetHeader
from faults.testing import replay
from middlebox.core.fault import Fault, Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Item
from middlebox.scenario import fingerprint as fp
from middlebox.scenario import fingerprint_llm as llm

TTFT = 0.12
ITL = 0.03
TOKENS = 64


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _event(index: int) -> bytes:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
             "choices": [{"index": 0, "delta": {"content": f" {index}"}, "logprobs": None,
                          "finish_reason": None}]}  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def timeline(
    gzip: bool = False, date: str = "Fri, 04 Dec 2026 23:00:00 GMT"
) -> list[tuple[float, Item]]:
    """A vLLM-like streamed chat completion: the head, a role chunk, TOKENS token events
    ITL apart, a finish chunk, `[DONE]`, the last chunk (vLLM's uvicorn keeps the
    connection open, so no FIN)."""
    accept = b"Accept-Encoding: gzip\r\n" if gzip else b""
    body = b'{"model": "m", "stream": true}'
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: llm\r\nContent-Type: application/json\r\n"
        + accept
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    head = (
        "HTTP/1.1 200 OK\r\ndate: " + date + "\r\nserver: uvicorn\r\n"
        "content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
    ).encode()
    role = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
    items: list[tuple[float, Item]] = [(0.0, Chunk(UP, request)), (0.01, Chunk(DOWN, head))]
    items.append((0.011, Chunk(DOWN, _chunk(role))))
    for index in range(TOKENS):
        items.append((TTFT + index * ITL, Chunk(DOWN, _chunk(_event(index)))))
    end = TTFT + TOKENS * ITL
    items.append((end, Chunk(DOWN, _chunk(b"data: [DONE]\n\n"))))
    items.append((end, Chunk(DOWN, b"0\r\n\r\n")))
    return items


def seen(path: list[Fault], gzip: bool = False, **kw: Any) -> fp.Response:
    """The client's side of the stream replayed through `path`."""
    out = replay(Pipeline(path), timeline(gzip, **kw))
    reads = [fp.Read(at, item.data) for at, item in out
             if isinstance(item, Chunk) and item.direction is DOWN]  # fmt: skip
    return fp.decode(reads, ended=False)


def streamed(path: list[Fault]) -> dict[str, Any]:
    return llm.streams([llm.stream(seen(path)) for _ in range(3)])


def document(path: list[Fault], **extra: Any) -> dict[str, Any]:
    """A fingerprint document of `path` against the direct stream, as the tool builds it."""
    through, direct = streamed(path), streamed([])
    doc: dict[str, Any] = {
        "url": "http://front/v1", "model": "m", "measures": {"stream": through},
        "direct": {"url": "http://llm/v1", "measures": {"stream": direct}},
        "path_adds": llm.path_adds(through, direct), "not_measured": [*llm.UNMEASURABLE],
    }  # fmt: skip
    doc["measures"].update(extra)
    return doc


def test_the_direct_stream_is_one_token_per_burst_with_its_ttft_and_gaps() -> None:
    found = llm.stream(seen([]))
    assert found["events"] == TOKENS and found["complete"] is True
    assert found["burst_events"] == 1 and set(found["bursts"]) == {1}
    assert abs(found["ttft"] - TTFT) < 1e-6
    assert abs(found["gap_median"] - ITL) < 1e-6 and abs(found["gap_max"] - ITL) < 1e-6


def test_a_4_kib_buffer_shows_as_bursts_of_its_size_and_a_late_first_token() -> None:
    found = streamed([ProxyBuffering()])
    burst = found["burst_events"]["value"]
    assert burst >= 10 and found["burst_events"]["uncertainty"] == 0
    # the buffer counts the chunk framing too: a burst's decoded bytes are a little less
    assert 3500 <= found["burst_bytes"]["value"] <= 4096
    adds = llm.path_adds(found, streamed([]))
    assert adds["held"] is True and adds["burst_ratio"] == burst
    assert adds["ttft"]["value"] >= (burst - 1) * ITL - 1e-6  # the buffer fills first
    lines = llm.summary(document([ProxyBuffering()]))
    assert lines[1].startswith("This path holds ~3.") and "first token" in lines[1], lines


def test_a_bare_path_holds_nothing_and_says_so() -> None:
    adds = llm.path_adds(streamed([]), streamed([]))
    assert adds["held"] is False and adds["burst_ratio"] == 1
    lines = llm.summary(document([]))
    assert lines[1].startswith("This path holds nothing a client can see"), lines
    assert not any(line.startswith("This path holds ~") for line in lines)


def test_a_per_request_date_is_not_a_header_change_and_an_added_header_is() -> None:
    one = seen([], date="Fri, 04 Dec 2026 23:00:00 GMT")
    other = seen([SetHeader(direction="response", headers={"X-Served-By": "edge"})],
                 date="Fri, 04 Dec 2026 23:00:09 GMT")  # fmt: skip
    changes = fp.header_changes(llm.stable_headers(one.headers), llm.stable_headers(other.headers))
    assert changes == {"added": [["X-Served-By", "edge"]], "removed": [], "changed": []}
    lines = llm.summary(document([], response_headers=changes))
    assert "Response headers: +X-Served-By: edge." in lines
    same = fp.header_changes(llm.stable_headers(one.headers), llm.stable_headers(one.headers))
    assert "Response headers: unchanged." in llm.summary(document([], response_headers=same))


def compression_of(path: list[Fault]) -> dict[str, Any]:
    plain, asked = seen(path), seen(path, gzip=True)
    body = fp.decoded(asked)
    assert body is not None
    return llm.compression(plain, asked, llm.stream(plain), llm.stream(body))


def test_gzip_flushed_per_event_flows_and_unflushed_gzip_is_held() -> None:
    flowing = compression_of([GzipEncoding(flush="sync")])
    assert (flowing["asked"], flowing["flush"], flowing["unasked"]) == ("gzip", "per-frame", None)
    held = compression_of([GzipEncoding(flush="none")])
    assert held["flush"] == "held" and held["first_frame_wait"] > 0.5
    said = llm.summary(document([], compression=held))
    assert any("the compressed bytes are held" in line for line in said), said
    said = llm.summary(document([], compression=flowing))
    assert not any("held" in line for line in said if "compress" in line), said
    assert any("flushed per frame" in line for line in said), said


def test_a_path_that_does_not_compress_says_so() -> None:
    found = compression_of([])
    assert found["compresses"] is False
    said = llm.summary(document([], compression=found))
    assert "It does not compress the event stream (asked with Accept-Encoding: gzip)." in said


# -- cancellation from /metrics -----------------------------------------------------------------

# vLLM 0.32's exposition (names and labels as a real server writes them: tests/real_vllm)
METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat"} 1.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="chat"} 1234.0
vllm:generation_tokens_created{engine="0",model_name="chat"} 1.7e9
"""


def test_the_metrics_are_read_summed_over_labels_and_missing_ones_are_none() -> None:
    assert llm.metric(METRICS, llm.RUNNING) == 1.0
    assert llm.metric(METRICS, llm.GENERATED) == 1234.0
    assert llm.metric("vllm:num_requests_waiting 0\n", llm.RUNNING) is None


def samples(stop_at: float | None, *, rate: float = 100.0) -> list[tuple[float, float, float]]:
    """/metrics every 50 ms: idle at 0, the request running from 0.1 s at `rate` tokens a
    second, the leave at 1.0 s, running back to 0 at `stop_at` (never when None)."""
    out: list[tuple[float, float, float]] = [(0.0, 0.0, 500.0)]
    t = 0.05
    tokens = 500.0
    while t <= 4.0:
        running = 1.0 if t >= 0.1 and (stop_at is None or t < stop_at) else 0.0
        tokens += rate * 0.05 * running
        out.append((round(t, 3), running, tokens))
        t += 0.05
    return out


def cancel_doc(found: dict[str, Any]) -> list[str]:
    return llm.summary(document([], cancel=found))


def test_a_server_that_stops_is_timed_to_the_sample_after_the_leave() -> None:
    found = llm.cancellation(samples(1.22), left_at=1.0, waited=3.0)
    assert found["stopped"] is True and found["seen_running"] is True
    assert abs(found["after"] - 0.25) < 1e-6 and abs(found["uncertainty"] - 0.05) < 1e-6
    assert found["tokens_after"] == 20  # 100 tokens/s, counted at 1.05 to 1.20
    said = cancel_doc(found)
    assert any(line.startswith("A client that leaves through the path is noticed by the server "
                               "0.250 s later") for line in said), said  # fmt: skip
    assert not any("generates for nobody" in line for line in said)


def test_a_server_that_never_stops_generates_for_nobody() -> None:
    found = llm.cancellation(samples(None), left_at=1.0, waited=3.0)
    assert found["stopped"] is False and found["at_least"] == 3.0
    assert found["tokens_after"] == 300
    said = cancel_doc(found)
    assert any("generates for nobody" in line and "within 3.0 s" in line for line in said), said
    assert not any("is noticed by the server" in line for line in said)


def test_a_gauge_that_never_showed_the_request_tells_nothing() -> None:
    flat = [(t, 0.0, 500.0) for t in (0.0, 0.5, 1.1, 1.2)]
    found = llm.cancellation(flat, left_at=1.0, waited=0.2)
    assert found == {"seen_running": False, "stopped": None}
    said = cancel_doc(found)
    assert any("never showed the request" in line for line in said), said
    assert not any("noticed" in line or "nobody" in line for line in said)


def test_what_needs_the_probe_is_named_with_why() -> None:
    said = llm.summary(document([]))
    named = [line for line in said if line.startswith("Not measured: ")]
    assert len(named) == len(llm.UNMEASURABLE)
    for what in ("hold's size", "timeouts before and after the head", "SSE heartbeats",
                 "framing toward the server"):  # fmt: skip
        assert any(what in line for line in named), (what, named)
    assert all("(" in line and "need" in line for line in named[:2] + named[3:])
