"""faults._sse_edit.SseBodyEditor: line edits on a response body whose untouched chunks
go out byte for byte and whose changed ones are re-encoded with honest sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from faults._lib.sse_edit import SseBodyEditor
from middlebox.core.http1 import LAST_CHUNK_BYTES, Http1Framer, Piece, encode_chunk
from middlebox.core.sse import SseKind, SsePiece
from tests.faults.httpprops import SSE_HEAD, dechunked, frame, rechunk

SIZED = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"


def body_pieces(wire: bytes) -> tuple[SseBodyEditor, list[Piece]]:
    """An editor for the response on `wire` and its body pieces, fed in one go."""
    framer = Http1Framer("response")
    pieces = framer.feed(wire)
    assert pieces[0].head is not None
    return SseBodyEditor(pieces[0].head), pieces[1:]


def run(wire: bytes, edit: object = None) -> bytes:
    """Feed every piece, calling `edit(editor, line)` per line, releasing after each."""
    editor, pieces = body_pieces(wire)
    out = bytearray()
    for piece in pieces:
        for line in editor.feed(piece):
            if callable(edit):
                edit(editor, line)
        out += editor.release()
    return bytes(out)


def drop_ids(editor: SseBodyEditor, line: SsePiece) -> None:
    if line.kind is SseKind.FIELD and line.field == "id":
        editor.replace(line, b"")


def test_without_edits_every_chunk_goes_out_as_it_came_extensions_and_bare_lf_included() -> None:
    body = encode_chunk(frame(0), ";a=1") + b"7\ndata:\n\n\n" + b"0\r\nX-T: 1\r\n\r\n"
    seen: list[SseKind] = []
    assert run(SSE_HEAD + body, lambda editor, line: seen.append(line.kind)) == body
    assert seen.count(SseKind.BLANK) == 2  # parsed, not passed through as broken framing


def test_a_dropped_line_split_over_two_chunks_re_encodes_both_and_nothing_else() -> None:
    text = b"data: a\n\nid: 12345\ndata: b\n\n"
    wire = (
        SSE_HEAD
        + encode_chunk(text[:9])
        + encode_chunk(text[9:13])
        + encode_chunk(text[13:])
        + LAST_CHUNK_BYTES
    )
    assert run(wire, drop_ids) == (
        encode_chunk(text[:9]) + encode_chunk(b"data: b\n\n") + LAST_CHUNK_BYTES
    )


def test_a_content_length_body_is_not_editable_and_passes_untouched() -> None:
    editor, pieces = body_pieces(SIZED % len(frame(0)) + frame(0))
    assert not editor.editable
    out = b""
    for piece in pieces:
        assert editor.feed(piece) == []
        out += editor.release()
    assert out == frame(0)
    with pytest.raises(RuntimeError):
        editor.insert(0, b"x")


def test_broken_chunk_framing_gives_up_and_passes_everything_as_it_came() -> None:
    wire = SSE_HEAD + encode_chunk(b"data: a") + b"zz\r\nmore"
    assert run(wire, drop_ids) == wire[len(SSE_HEAD) :]


def test_edits_and_cuts_outside_the_complete_lines_are_refused() -> None:
    editor, pieces = body_pieces(SSE_HEAD + encode_chunk(b"data: a\n\ndata: b"))
    for piece in pieces:
        editor.feed(piece)
    assert editor.complete_to == 9
    with pytest.raises(ValueError):
        editor.insert(10, b"x")
    with pytest.raises(ValueError):
        editor.end(12, last_chunk=True)
    assert editor.end(9, last_chunk=True) == encode_chunk(b"data: a\n\n") + LAST_CHUNK_BYTES
    assert editor.feed(pieces[-1]) == [] and editor.release() == b""


@given(
    events=st.integers(1, 5),
    at=st.sets(st.integers(0, 5)),
    chunk_cuts=st.lists(st.integers(0, 300), max_size=8),
)
def test_insertions_at_event_boundaries_read_back_in_place_whatever_the_chunking(
    events: int, at: set[int], chunk_cuts: list[int]
) -> None:
    text = b"".join(frame(i) for i in range(events))
    boundaries = {k * len(frame(0)) for k in at if k <= events}

    def insert(editor: SseBodyEditor, line: SsePiece) -> None:
        end = line.offset + len(line.data)
        if line.kind is SseKind.BLANK and end in boundaries:
            editor.insert(end, b": mark\n\n")

    editor, pieces = body_pieces(SSE_HEAD + rechunk(text, chunk_cuts))
    if 0 in boundaries:
        editor.insert(0, b": mark\n\n")
    out = bytearray()
    for piece in pieces:
        for line in editor.feed(piece):
            insert(editor, line)
        out += editor.release()
    expected = b"".join(
        (b": mark\n\n" if k * len(frame(0)) in boundaries else b"") + frame(k)
        for k in range(events)
    ) + (b": mark\n\n" if events * len(frame(0)) in boundaries else b"")
    assert dechunked(SSE_HEAD + bytes(out)) == [(expected, True)]
