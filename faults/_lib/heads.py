"""`HeadRewriter`: the mixin for faults that rewrite heads (strip_header, set_header) (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from faults._lib.items import joined_chunk
from faults._lib.match import REQUESTS, RESPONSES, HttpMatched
from middlebox.core.framed import Framed, FramedStream
from middlebox.core.http1 import (
    Head,
    Piece,
    moved_piece,
    serialize_head,
)
from middlebox.core.stream import Chunk, Direction, Item

HeaderDirection = Literal["response", "request"]


@dataclass
class HeadRewriter(HttpMatched):
    """Mixin for faults that rewrite the head of matched messages in one `direction`
    (`response`: the server's final heads, 1xx interim heads left alone; `request`: the
    client's, each held until decided). Everything else passes byte-exact.
    Subclasses implement `rewrite(head)`: the new head and report details, or None when
    the head needs no change. The fault knows what it wrote, so it hands the faults past
    it the pieces of its output (the new head, the rest shifted) instead of having them
    framed again."""

    direction: HeaderDirection = "response"

    _shift: int = field(init=False, repr=False, compare=False, default=0)
    # response bytes the framer held after the last item (an unfinished chunk line)
    _held_bytes: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if self.direction not in ("response", "request"):
            raise ValueError(f"direction must be 'response' or 'request', got {self.direction!r}")

    @property
    def _target(self) -> Direction:
        return Direction.UPSTREAM if self.direction == "request" else Direction.DOWNSTREAM

    def changes(self) -> frozenset[Direction]:
        return REQUESTS if self.direction == "request" else RESPONSES

    def publishes(self) -> frozenset[Direction]:
        return self.changes()

    def rewrite(self, head: Head) -> tuple[Head, dict[str, Any]] | None:
        raise NotImplementedError

    def on_item(self, item: Item, now: float) -> list[Item]:
        target = self._target
        self.observe(item, now)
        if item.direction is not target:
            return [item]
        framed = self._flow.framed
        if target is Direction.UPSTREAM:
            framed = self.gate_framed(framed)
        else:
            held_before, self._held_bytes = self._held_bytes, self._flow.responses.held
            if (
                not held_before
                and not self._held_bytes
                and isinstance(item, Chunk)
                and all(entry.piece.head is None for entry in framed)
            ):
                return self._body_as_it_came(item, framed)
        parts: list[bytes] = []
        out_framed: list[Framed] = []
        for entry in framed:
            piece = entry.piece
            head = piece.head
            index = self.selected(piece.message)
            changed = None
            if head is not None and not head.is_interim and index is not None:
                changed = self.rewrite(head)
            if changed is None:
                parts.append(piece.data)
                out_framed.append(_shifted(entry, self._shift) if self._shift else entry)
                continue
            new_head, details = changed
            data = serialize_head(new_head)
            parts.append(data)
            out_framed.append(
                Framed(
                    Piece(
                        piece.kind,
                        data,
                        piece.message,
                        piece.offset + self._shift,
                        new_head,
                        piece.end_of_message,
                    )
                )
            )
            self._shift += len(data) - len(piece.data)
            self._fault.report(
                now,
                "rewrote_head",
                direction=self.direction,
                request=index,
                message=piece.message,
                offset=piece.offset,
                **details,
            )
        self.publish(target, out_framed)
        out = joined_chunk(target, parts)
        if isinstance(item, Chunk):
            return out
        self.publish_end(target)
        return [*out, item]

    def _published(self, direction: Direction) -> FramedStream | None:
        """The stream this fault publishes `direction`'s pieces to, if any."""
        framing = self._fault.context.framing
        return framing.publish.get(direction) if framing is not None else None

    def _body_as_it_came(self, item: Chunk, framed: list[Framed]) -> list[Item]:
        """Body bytes after the head, none held before or after them, so the bytes are
        exactly the pieces': they go on as they came, only moved by what an earlier
        head's rewrite added; no head, so nothing to decide per piece."""
        shift = self._shift
        target = self._target
        if not shift:
            self.publish(target, framed)
            return [item]
        stream = self._published(target)
        if stream is not None and framed and not stream.read:
            # nobody past this fault reads the pieces: count them, make none
            last = framed[-1].piece
            stream.pass_unread(len(framed), last.offset + len(last.data) + shift)
        else:
            self.publish(target, [_shifted(entry, shift) for entry in framed])
        return [item]


def _shifted(entry: Framed, shift: int) -> Framed:
    """`entry` at `shift` bytes further into the stream (a head before it changed size)."""
    return Framed(moved_piece(entry.piece, shift), entry.lines, entry.body_offset)
