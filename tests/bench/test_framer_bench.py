"""bench/framer.py's inputs and its Python timing loop: every workload is framed by the
framer without a refusal, byte for byte, into the units its figure divides by (a figure
per frame, response or request means nothing if the input holds another count); the
llhttp candidate is optional and named when missing."""

from __future__ import annotations

import pytest

from bench import framer
from middlebox.core.http1 import Http1Framer, PieceKind


@pytest.mark.parametrize("name", sorted(framer.workloads(1)))
def test_each_workload_frames_whole_into_the_units_it_counts(name: str) -> None:
    role, reads, units, unit = framer.workloads(200)[name]
    parser = Http1Framer(role)
    pieces = [piece for data in reads for piece in parser.feed(data)] + parser.feed_eof()
    assert b"".join(piece.data for piece in pieces) == b"".join(reads)
    assert PieceKind.OPAQUE not in {piece.kind for piece in pieces}
    heads = sum(piece.kind is PieceKind.HEAD for piece in pieces)
    ends = sum(piece.end_of_message for piece in pieces)
    if unit == "frame":  # one SSE response whose chunks are the frames
        chunks = sum(piece.kind is PieceKind.CHUNK_HEADER for piece in pieces)
        assert (heads, ends, chunks) == (1, 1, units)
    else:  # a response or a request per unit
        assert heads == ends == units


def test_the_timing_loop_counts_the_pieces_it_timed() -> None:
    role, reads, _, _ = framer.workloads(50)["sse-per-read"]
    spent, count = framer.run_once(framer.python_framer, role, reads)
    parser = Http1Framer(role)
    pieces = [piece for data in reads for piece in parser.feed(data)] + parser.feed_eof()
    # per frame at least its chunk header, the frame and its CRLF
    assert spent >= 0 and count == len(pieces) >= 50 * 3


def test_the_candidate_without_llhttp_is_a_usage_error_naming_the_package(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(__import__("sys").modules, "llhttp", None)  # import fails
    with pytest.raises(SystemExit) as ended:
        framer.main(["--parser", "llhttp", "--frames", "1", "--repeats", "1"])
    assert ended.value.code == 2
    assert "pip install llhttp==9.3.0.0" in capsys.readouterr().err
