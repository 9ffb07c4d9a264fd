"""`Fault.body_aside`: a fault that reads the response framing but needs only heads and
message ends is passed over for a body's bytes, with its place in the framed stream kept
(`BodyPass`), and sees the next head, a message's end and anything the framer holds
itself, exactly as if it had been given every item. On a virtual clock (no sockets)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import ClassVar

from middlebox.core.fault import Fault, FaultContext, Pipeline
from middlebox.core.framed import BodyPass, Framed
from middlebox.core.http1 import LAST_CHUNK_BYTES, PieceKind, encode_chunk
from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item

REQUEST = b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
LENGTH_HEAD = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n"
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@dataclass
class HeadsOnly(Fault):
    """Reads the responses' framing at its place; wants only heads and message ends."""

    name: ClassVar[str] = "heads_only"
    aside_bodies: bool = True
    pass_ends: bool = False  # the BodyPass's `ends`: a body's last piece may pass it too
    given: list[bytes] = field(init=False, repr=False, default_factory=list)
    ends: list[Item] = field(init=False, repr=False, default_factory=list)
    pieces: list[Framed] = field(init=False, repr=False, default_factory=list)
    passing: BodyPass | None = field(init=False, repr=False, default=None)

    def reads_http(self) -> bool:
        return True

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        assert context.framing is not None
        self.passing = BodyPass(DOWN, context.framing.down.reader(), None, ends=self.pass_ends)
        if self.aside_bodies:
            self.body_aside = self.passing

    def on_item(self, item: Item, now: float) -> list[Item]:
        if isinstance(item, Chunk) and item.direction is DOWN:
            assert self.passing is not None
            self.given.append(item.data)
            self.pieces.extend(self.passing.reader.advance(len(item.data)))
        elif item.direction is DOWN:
            self.ends.append(item)
        return [item]


def run(fault: HeadsOnly, downs: list[bytes], requests: bytes = REQUEST) -> bytes:
    pipeline = Pipeline([fault])
    pipeline.bind(FaultContext(rng=random.Random(0)))
    pipeline.open(0.0)
    out = pipeline.feed(Chunk(UP, requests), 0.0).items
    for step, data in enumerate(downs):
        out += pipeline.feed(Chunk(DOWN, data), 0.1 * (step + 1)).items
    return b"".join(i.data for i in out if isinstance(i, Chunk) and i.direction is DOWN)


def kinds(pieces: list[Framed]) -> list[tuple[PieceKind, int]]:
    return [(entry.piece.kind, entry.piece.message) for entry in pieces]


def test_a_length_body_is_passed_over_and_the_next_head_reaches_it() -> None:
    fault = HeadsOnly()
    downs = [LENGTH_HEAD, b"01234", b"567", b"89", LENGTH_HEAD + b"abc", b"defghij"]
    out = run(fault, downs, REQUEST * 2)
    assert out == b"".join(downs)
    # the body's bytes before each end pass it by; the end and the next head reach it
    assert fault.given == [LENGTH_HEAD, b"89", LENGTH_HEAD + b"abc", b"defghij"]
    # and its reader saw nothing twice and missed nothing: the next head is whole
    assert kinds(fault.pieces) == [
        (PieceKind.HEAD, 0),
        (PieceKind.BODY, 0),
        (PieceKind.HEAD, 1),
        (PieceKind.BODY, 1),
        (PieceKind.BODY, 1),
    ]
    assert fault.pieces[2].piece.offset == len(LENGTH_HEAD) + 10
    assert fault.pieces[1].piece.data == b"89"


def test_with_ends_a_length_body_s_last_bytes_pass_it_too_but_not_a_head_or_a_last_chunk() -> None:
    fault = HeadsOnly(pass_ends=True)
    downs = [LENGTH_HEAD, b"01234", b"56789", LENGTH_HEAD + b"abc", b"defg", b"hij" + CHUNKED_HEAD]
    downs += [encode_chunk(b"data: a\n\n"), LAST_CHUNK_BYTES]
    out = run(fault, downs, REQUEST * 3)
    assert out == b"".join(downs)
    # the ends pass it by; a read with the next head in it, and the last chunk, do not
    assert fault.given == [LENGTH_HEAD, LENGTH_HEAD + b"abc", b"hij" + CHUNKED_HEAD, downs[-1]]
    # its reader kept up: every piece once, in order, the heads whole
    assert sum(len(e.piece.data) for e in fault.pieces) == len(b"".join(downs)) - 10 - 4 - 14
    heads = [e.piece for e in fault.pieces if e.piece.kind is PieceKind.HEAD]
    assert [(h.message, h.offset) for h in heads] == [
        (0, 0),
        (1, len(LENGTH_HEAD) + 10),
        (2, 2 * len(LENGTH_HEAD) + 20),
    ]


def test_a_pipelined_second_message_in_the_same_read_as_a_body_reaches_it() -> None:
    fault = HeadsOnly()
    downs = [LENGTH_HEAD + b"0123", b"45", b"6789" + LENGTH_HEAD, b"0123456789"]
    out = run(fault, downs, REQUEST * 2)
    assert out == b"".join(downs)
    assert fault.given == [LENGTH_HEAD + b"0123", b"6789" + LENGTH_HEAD, b"0123456789"]
    heads = [e.piece for e in fault.pieces if e.piece.kind is PieceKind.HEAD]
    assert [(h.message, h.offset) for h in heads] == [(0, 0), (1, len(LENGTH_HEAD) + 10)]


def test_a_chunked_body_passes_it_by_but_a_split_chunk_line_and_the_last_chunk_do_not() -> None:
    fault = HeadsOnly()
    first, second = encode_chunk(b"data: a\n\n"), encode_chunk(b"data: b\n\n")
    downs = [CHUNKED_HEAD, first, second[:2], second[2:], LAST_CHUNK_BYTES]
    out = run(fault, downs)
    assert out == b"".join(downs)
    # a whole chunk is body; a chunk-size line cut by the read is held by the framer
    # (the fault takes it whole), then the rest of it; the last chunk ends the message
    assert fault.given == [CHUNKED_HEAD, second[:2], second[2:], LAST_CHUNK_BYTES]
    assert [entry.piece.kind for entry in fault.pieces][-2:] == [
        PieceKind.LAST_CHUNK,
        PieceKind.TRAILERS,
    ]
    assert sum(len(entry.piece.data) for entry in fault.pieces) == len(b"".join(downs)) - len(first)


def test_without_body_aside_it_is_given_every_item() -> None:
    fault = HeadsOnly(aside_bodies=False)
    downs = [LENGTH_HEAD, b"01234", b"567", b"89"]
    assert run(fault, downs) == b"".join(downs)
    assert fault.given == downs


@dataclass
class ChangesMind(HeadsOnly):
    """Wants the first response's body (steps aside from the second on): it says so in
    its own hook, at the first head and at that message's end."""

    name: ClassVar[str] = "changes_mind"

    def on_item(self, item: Item, now: float) -> list[Item]:
        seen = len(self.pieces)
        out = super().on_item(item, now)
        for entry in self.pieces[seen:]:
            piece = entry.piece
            if piece.kind is PieceKind.HEAD and piece.message == 0:
                self.body_aside = None
            elif piece.end_of_message and piece.message == 0:
                self.body_aside = self.passing
        return out


def test_a_fault_that_changes_its_mind_is_given_what_it_asked_for() -> None:
    fault = ChangesMind()
    downs = [LENGTH_HEAD, b"01234", b"567", b"89", LENGTH_HEAD + b"abc", b"de", b"fghij"]
    assert run(fault, downs, REQUEST * 2) == b"".join(downs)
    assert fault.given == [LENGTH_HEAD, b"01234", b"567", b"89", LENGTH_HEAD + b"abc", b"fghij"]
    # its reader is where a call per item would have put it: the second body's "de" was
    # advanced over for it, so "fghij" is read at its own offset
    last = fault.pieces[-1].piece
    assert (last.data, last.offset) == (b"fghij", 2 * len(LENGTH_HEAD) + 15)


@dataclass
class TakesBackAt(HeadsOnly):
    """HeadsOnly that takes its body pass back at a deadline of its own."""

    at: float = 0.25

    def deadline(self) -> float | None:
        return self.at if self.body_aside is not None else None

    def on_deadline(self, now: float) -> list[Item]:
        self.body_aside = None
        return []


def test_taken_back_in_a_later_call_it_is_given_the_rest_from_where_it_was() -> None:
    fault = TakesBackAt()
    pipeline = Pipeline([fault])
    pipeline.bind(FaultContext(rng=random.Random(0)))
    pipeline.feed(Chunk(UP, REQUEST), 0.0)
    pipeline.feed(Chunk(DOWN, LENGTH_HEAD), 0.1)
    pipeline.feed(Chunk(DOWN, b"01"), 0.2)  # passed over
    pipeline.wake(0.25)  # it takes its body pass back
    for data in (b"234", b"567", b"89"):
        pipeline.feed(Chunk(DOWN, data), 0.3)
    assert fault.given == [LENGTH_HEAD, b"234", b"567", b"89"]
    body = [e.piece for e in fault.pieces if e.piece.kind is PieceKind.BODY]
    assert [(p.data, p.offset) for p in body] == [
        (b"234", len(LENGTH_HEAD) + 2),
        (b"567", len(LENGTH_HEAD) + 5),
        (b"89", len(LENGTH_HEAD) + 8),
    ]
    assert body[-1].end_of_message


def test_an_end_of_stream_always_reaches_it() -> None:
    fault = HeadsOnly()
    pipeline = Pipeline([fault])
    pipeline.bind(FaultContext(rng=random.Random(0)))
    pipeline.feed(Chunk(UP, REQUEST), 0.0)
    pipeline.feed(Chunk(DOWN, LENGTH_HEAD + b"01"), 0.1)
    given = len(fault.given)
    pipeline.feed(Chunk(DOWN, b"23"), 0.2)
    out = pipeline.feed(Eof(DOWN), 0.3).items
    assert len(fault.given) == given  # the body's bytes passed it by
    assert fault.ends == [Eof(DOWN)]
    assert out == [Eof(DOWN)]
