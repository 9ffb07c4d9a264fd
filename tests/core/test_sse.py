"""The SSE framer finds WHATWG events in a body however it is split, without changing a byte."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from middlebox.core.http1 import LAST_CHUNK_BYTES, Http1Framer, PieceKind, encode_chunk
from middlebox.core.sse import (
    SseEvent,
    SseFramer,
    SseKind,
    SsePiece,
    utf8_cut_offsets,
    utf8_incomplete_tail,
)

# vLLM 0.33.0 /v1/chat/completions frames (shared/reference/vllm-wire.md §1.2), byte-exact.
VLLM_FRAMES = [
    b'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk",'
    b'"created":1764400000,"model":"Qwen/Qwen3-0.6B",'
    b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
    b'"logprobs":null,"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n',
    b'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk",'
    b'"created":1764400000,"model":"Qwen/Qwen3-0.6B",'
    b'"choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,'
    b'"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}\n\n',
    b'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk",'
    b'"created":1764400000,"model":"Qwen/Qwen3-0.6B",'
    b'"choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,'
    b'"finish_reason":null,"token_ids":null}],"kv_transfer_params":null}\n\n',
    b'data: {"id":"chatcmpl-8c1e6f0a3b2d4e95","object":"chat.completion.chunk",'
    b'"created":1764400000,"model":"Qwen/Qwen3-0.6B",'
    b'"choices":[{"index":0,"delta":{"content":" How"},"logprobs":null,'
    b'"finish_reason":"length","stop_reason":null,"token_ids":null,"weight_versions":null}],'
    b'"system_fingerprint":"vllm-0.33.0-1a2b3c4d","kv_transfer_params":null}\n\n',
    b"data: [DONE]\n\n",
]
VLLM_STREAM = b"".join(VLLM_FRAMES)


def frame(parts: list[bytes]) -> tuple[list[SsePiece], SseFramer]:
    framer = SseFramer()
    pieces: list[SsePiece] = []
    for part in parts:
        pieces += framer.feed(part)
    pieces += framer.feed_eof()
    return pieces, framer


def events(pieces: list[SsePiece]) -> list[SseEvent]:
    return [p.event for p in pieces if p.event is not None]


def joined(pieces: list[SsePiece]) -> bytes:
    return b"".join(p.data for p in pieces)


def reference_events(data: bytes) -> list[tuple[str, str, str]]:
    """An independent whole-input reading of the WHATWG rules: (type, data, last id)."""
    text = data.decode("utf-8", "replace").removeprefix("\ufeff")
    lines = re.split(r"\r\n|\r|\n", text)[:-1]  # the unterminated tail is discarded
    out: list[tuple[str, str, str]] = []
    buf, kind, last_id = "", "", ""
    for line in lines:
        if line == "":
            if buf:
                out.append((kind or "message", buf.removesuffix("\n"), last_id))
            buf, kind = "", ""
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            buf += value + "\n"
        elif name == "event":
            kind = value
        elif name == "id" and "\0" not in value:
            last_id = value
    return out


def test_a_vllm_stream_gives_one_event_per_frame_and_ends_with_done() -> None:
    pieces, framer = frame([VLLM_STREAM])
    got = events(pieces)
    assert [e.raw for e in got] == VLLM_FRAMES
    assert [e.index for e in got] == [0, 1, 2, 3, 4]
    assert got[1].data.endswith('"kv_transfer_params":null}') and got[1].event == "message"
    assert [e.is_done for e in got] == [False] * 4 + [True]
    assert [p.kind for p in pieces] == [SseKind.FIELD, SseKind.BLANK] * 5
    assert framer.done and framer.events == 5 and not framer.truncated


def test_every_two_way_split_of_a_vllm_stream_gives_the_same_pieces() -> None:
    whole, _ = frame([VLLM_STREAM])
    for cut in range(len(VLLM_STREAM) + 1):
        pieces, _ = frame([VLLM_STREAM[:cut], VLLM_STREAM[cut:]])
        assert pieces == whole, cut


MIXED = (
    b"\xef\xbb\xbf: hello\r\n\r\nretry: 1500\rid: 7\r\nevent: delta\n"
    b"data: caf\xc3\xa9\r\ndata\rdata:  two spaces\n\r\n"
    b"id: a\x00b\nretry: 10s\ndata: x\r\rdata: [DONE]\r\n\r\n"
)


def test_every_two_way_split_of_mixed_line_endings_gives_the_same_pieces() -> None:
    whole, _ = frame([MIXED])
    assert joined(whole) == MIXED
    for cut in range(len(MIXED) + 1):
        pieces, _ = frame([MIXED[:cut], MIXED[cut:]])
        assert pieces == whole, cut
    bytewise, _ = frame([MIXED[i : i + 1] for i in range(len(MIXED))])
    assert bytewise == whole


def test_mixed_line_endings_bom_id_retry_and_multiline_data_follow_the_spec() -> None:
    pieces, framer = frame([MIXED])
    assert pieces[0].kind is SseKind.BOM and pieces[0].data == b"\xef\xbb\xbf"
    first, second, done = events(pieces)
    assert first.data == "caf\u00e9\n\n two spaces"
    assert first.event == "delta" and first.id == "7" and first.retry == 1500
    assert first.raw.startswith(b"retry: 1500\r") and first.raw.endswith(b"\n\r\n")
    # an id containing NUL and a non-numeric retry are ignored; the id sticks
    assert second.data == "x" and second.id is None and second.last_event_id == "7"
    assert second.retry is None and framer.retry == 1500
    assert done.is_done and done.event == "message"
    assert [(e.event, e.data, e.last_event_id) for e in events(pieces)] == reference_events(MIXED)


def test_a_crlf_split_across_feeds_stays_one_line_end() -> None:
    framer = SseFramer()
    assert framer.feed(b"data: a\r") == []
    assert framer.mid_line and framer.buffered == 8
    pieces = framer.feed(b"\n\r") + framer.feed(b"\n")
    assert [(p.kind, p.data) for p in pieces] == [
        (SseKind.FIELD, b"data: a\r\n"),
        (SseKind.BLANK, b"\r\n"),
    ]
    assert events(pieces)[0].data == "a"


def test_a_cr_at_eof_ends_the_line_it_closes() -> None:
    pieces, framer = frame([b"data: a\r\r"])
    assert [p.kind for p in pieces] == [SseKind.FIELD, SseKind.BLANK]
    assert events(pieces)[0].data == "a" and not framer.truncated


def test_a_comment_only_block_dispatches_nothing_but_is_visible() -> None:
    pieces, framer = frame([b": ping\n\n: keep-alive\r\ndata: x\n\n"])
    assert [p.kind for p in pieces] == [
        SseKind.COMMENT,
        SseKind.BLANK,
        SseKind.COMMENT,
        SseKind.FIELD,
        SseKind.BLANK,
    ]
    assert pieces[1].event is None
    (event,) = events(pieces)
    assert event.comments == (" keep-alive",) and event.index == 0 and framer.events == 1
    assert pieces[0].data[pieces[0].value_start : pieces[0].value_end] == b" ping"


def test_a_data_line_without_colon_dispatches_an_empty_event() -> None:
    pieces, _ = frame([b"data\n\nfoo: bar\nevent\n\n"])
    assert [e.data for e in events(pieces)] == [""]
    assert pieces[2].field == "foo"


def test_a_bom_only_counts_at_the_very_start_and_only_once() -> None:
    bom = b"\xef\xbb\xbf"
    pieces, _ = frame([bom[:1], bom[1:] + bom + b"data: x\n\n"])
    assert pieces[0].kind is SseKind.BOM
    # the second BOM is part of the field name, so the line is an unknown field
    assert pieces[1].kind is SseKind.FIELD and pieces[1].field == "\ufeffdata"
    assert events(pieces) == []
    not_bom, _ = frame([b"\xef", b"\xbb", b"x\n"])
    assert [(p.kind, p.data) for p in not_bom] == [(SseKind.FIELD, b"\xef\xbbx\n")]


def test_eof_inside_an_event_is_truncation_and_passes_the_partial_line_on() -> None:
    pieces, framer = frame([VLLM_FRAMES[0], VLLM_FRAMES[1][:40]])
    assert len(events(pieces)) == 1
    assert pieces[-1].kind is SseKind.PARTIAL and pieces[-1].data == VLLM_FRAMES[1][:40]
    assert framer.truncated and not framer.done
    no_blank, framer = frame([b"data: whole line\n"])
    assert events(no_blank) == [] and framer.truncated and not framer.mid_line


def test_eof_after_a_whole_event_is_not_truncation() -> None:
    _, framer = frame([VLLM_STREAM])
    assert not framer.truncated and not framer.in_event


def test_a_partial_bom_at_eof_comes_back_as_a_partial_line() -> None:
    pieces, framer = frame([b"\xef\xbb"])
    assert [(p.kind, p.data) for p in pieces] == [(SseKind.PARTIAL, b"\xef\xbb")]
    assert framer.truncated


def test_field_pieces_give_the_byte_span_of_their_value() -> None:
    pieces, _ = frame([b"data: caf\xc3\xa9\ndata:x\r\nid\n\n"])
    spans = [(p.field, p.data[p.value_start : p.value_end]) for p in pieces[:3]]
    assert spans == [("data", b"caf\xc3\xa9"), ("data", b"x"), ("id", b"")]
    assert [p.offset for p in pieces] == [0, 12, 20, 23]


def test_utf8_helpers_find_cuts_inside_multibyte_sequences() -> None:
    data = "a\u00e9\u20ac\U0001f600".encode()
    assert utf8_cut_offsets(data) == [2, 4, 5, 7, 8, 9]
    assert [utf8_incomplete_tail(data[:i]) for i in range(len(data) + 1)] == [
        0, 0, 1, 0, 1, 2, 0, 1, 2, 3, 0,
    ]  # fmt: skip
    assert utf8_incomplete_tail(b"\x80\x80\x80\x80") == 0


def test_the_framer_knows_when_the_bytes_so_far_end_inside_a_character_or_event() -> None:
    framer = SseFramer()
    framer.feed(b"data: caf\xc3")
    assert framer.mid_utf8 and framer.mid_line and not framer.in_event
    framer.feed(b"\xa9\n")
    assert not framer.mid_utf8 and not framer.mid_line and framer.in_event
    assert framer.received == 12 and framer.offset == 12


def test_feeding_after_eof_is_a_programming_error() -> None:
    framer = SseFramer()
    framer.feed_eof()
    with pytest.raises(RuntimeError):
        framer.feed(b"x")


def test_body_pieces_of_a_chunked_vllm_response_feed_the_sse_framer() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    wire = head + b"".join(encode_chunk(f) for f in VLLM_FRAMES) + LAST_CHUNK_BYTES
    http = Http1Framer("response")
    sse = SseFramer()
    got: list[SsePiece] = []
    for i in range(0, len(wire), 37):
        for piece in http.feed(wire[i : i + 37]):
            if piece.kind is PieceKind.BODY:
                got += sse.feed(piece.data)
    assert http.message_complete
    assert [e.raw for e in events(got)] == VLLM_FRAMES and sse.done


# -- properties ---------------------------------------------------------------------------

LINE_PARTS = st.sampled_from(
    [
        b"data",
        b"data:",
        b"data: ",
        b"event:",
        b"id: ",
        b"retry: ",
        b": c",
        b"x",
        b"12",
        b" ",
        b"\x00",
        b"\xc3\xa9",
        b"\xe2\x82",
        b"\xac",
        b"\xef\xbb\xbf",
        b"[DONE]",
        b"\n",
        b"\r",
        b"\r\n",
    ]
)


def splits(data: st.DataObject, stream: bytes) -> list[bytes]:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    edges = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_random_streams_split_anywhere_match_a_whole_input_reading_of_the_spec(
    data: st.DataObject,
) -> None:
    stream = b"".join(data.draw(st.lists(LINE_PARTS, max_size=60)))
    whole, _ = frame([stream])
    pieces, framer = frame(splits(data, stream))
    assert joined(pieces) == stream
    assert pieces == whole
    got = [(e.event, e.data, e.last_event_id) for e in events(pieces)]
    assert got == reference_events(stream)
    assert framer.events == len(got) and framer.offset == len(stream)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_random_splits_of_a_long_vllm_stream_give_the_same_events(data: st.DataObject) -> None:
    frames = VLLM_FRAMES[:-1] * 20 + [b": ping\n\n", VLLM_FRAMES[-1]]
    stream = b"".join(frames)
    pieces, framer = frame(splits(data, stream))
    assert joined(pieces) == stream
    assert [e.raw for e in events(pieces)] == VLLM_FRAMES[:-1] * 20 + [VLLM_FRAMES[-1]]
    assert framer.done and not framer.truncated


def test_an_id_takes_effect_only_when_its_block_is_dispatched() -> None:
    # WPT eventsource/format-data-before-final-empty-line: the last block has no blank
    # line, so it is never dispatched and its id never becomes the last event ID.
    framer = SseFramer()
    framer.feed(b"id: 1\ndata: a\n\nid: 2\ndata: b")
    assert framer.last_event_id == "1"
    framer.feed_eof()
    assert framer.last_event_id == "1" and framer.truncated


def test_an_id_in_a_block_without_data_still_sets_the_last_event_id_at_dispatch() -> None:
    # WHATWG 9.2.6 dispatch step 1 runs before the empty-data check; the buffer persists.
    framer = SseFramer()
    pieces = framer.feed(b"id: 7\n\ndata: x\n\n")
    events = [p.event for p in pieces if p.event is not None]
    assert framer.last_event_id == "7" and [e.last_event_id for e in events] == ["7"]
