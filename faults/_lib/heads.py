"""`HeadRewriter`: the mixin for faults that rewrite heads (strip_header, set_header) (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from faults._lib.items import joined_chunk
from faults._lib.match import REQUESTS, RESPONSES, HttpMatched
from middlebox.core.fault import FaultContext
from middlebox.core.framed import BodyPass, Framed, shifted
from middlebox.core.http1 import Head, new_piece, serialize_head
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
    framed again.

    Between a response's head and its end it has nothing to decide, so it steps aside for
    the body (`Fault.body_aside`): the pipeline keeps its place in the response stream
    and publishes the body's pieces for it, moved by what its head rewrites added."""

    direction: HeaderDirection = "response"

    # its place in the target stream and what its rewrites shifted the bytes after it by
    _body: BodyPass = field(init=False, repr=False, compare=False)
    # response bytes the framer held after the last item (an unfinished chunk line)
    _held_bytes: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if self.direction not in ("response", "request"):
            raise ValueError(f"direction must be 'response' or 'request', got {self.direction!r}")

    @property
    def _target(self) -> Direction:
        return Direction.UPSTREAM if self.direction == "request" else Direction.DOWNSTREAM

    def bind(self, context: FaultContext) -> None:
        super().bind(context)
        target = self._target
        framing = context.framing
        # A message's end needs nothing of it either (`ends`): a Content-Length body read
        # whole passes it by too.
        self._body = BodyPass(
            target,
            self._flow.reader(target),
            framing.publish.get(target) if framing is not None else None,
            ends=True,
        )
        if target is Direction.DOWNSTREAM and framing is not None:
            # A request is held until decided (`gate_framed`), so only responses' bodies
            # are passed over; a fault framing on its own is not in a pipeline.
            self._fault.body_aside = self._body

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
                # body bytes after the head, none held before or after them: they go on
                # as they came, moved only by what an earlier head's rewrite added
                self._body.publish_passed(framed)
                return [item]
        parts: list[bytes] = []
        out_framed: list[Framed] = []
        for entry in framed:
            piece = entry.piece
            head = piece.head
            index = self.selected(piece.message)
            changed = None
            if head is not None and not head.is_interim and index is not None:
                changed = self.rewrite(head)
            shift = self._body.shift
            if changed is None:
                parts.append(piece.data)
                out_framed.append(shifted(entry, shift) if shift else entry)
                continue
            new_head, details = changed
            data = serialize_head(new_head)
            parts.append(data)
            out_framed.append(
                Framed(
                    new_piece(
                        piece.kind,
                        data,
                        piece.message,
                        piece.offset + shift,
                        new_head,
                        piece.end_of_message,
                    )
                )
            )
            self._body.shift = shift + len(data) - len(piece.data)
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
