"""`middlebox record --upstream URL --out DIR`: record a real server's responses as
cassettes the emulator replays (`vllm_emulator` with `cassette: FILE`).

The recorder is a pass-through middlebox proxy with byte capture. When a response
has ended, its upstream-leg bytes are framed with the passive HTTP/1.1 framer and
written as one cassette per response, in the emulator's format:

    {"status": 200, "headers": [["content-type", "text/event-stream"], ...],
     "writes": [[seconds_after_the_request, "base64 of body bytes"], ...],
     "request": {"method": "POST", "target": "/v1/chat/completions", "body": ...}}

`writes` hold the de-chunked body, one entry per read from the upstream (what the
server flushed together stays together), timed from the moment the request's last
byte was sent upstream, which is when the emulator's handler starts replaying. The
emulator re-frames the body itself (chunked or Content-Length), so a response the
server cut short is recorded as far as it got, with `truncated` saying how it ended
(the replay then ends cleanly). Secrets are blanked by the journal's one rule
(`observe.journal.Redaction`, the store's: names saying key, token, secret, auth,
OpenAI-Organization and -Project, plus any configured names): header values in both
heads, query parameters in the request target, JSON fields in the request body.
"""

from __future__ import annotations

import base64
import bisect
import itertools
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from middlebox.core.http1 import Piece, PieceKind
from middlebox.core.stream import Direction
from middlebox.observe.journal import (
    DEFAULT_REDACTION,
    ConnectionJournal,
    JournalStore,
    Redaction,
)
from middlebox.run.serve import proxy_config
from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyServer, listen

log = logging.getLogger("middlebox.tools.record")

SCAN_INTERVAL = 0.5


def _request_body(data: bytes, redaction: Redaction) -> Any:
    data = redaction.data(data, request=True)
    try:
        return json.loads(data)
    except ValueError:
        return base64.b64encode(data).decode("ascii")


def cassettes(journal: ConnectionJournal) -> list[dict[str, Any]]:
    """One cassette per complete response on the connection's upstream leg, its secrets
    blanked by the journal's redaction."""
    redaction = journal.redaction
    ended = [kind for leg, _, kind in journal.end_kinds if leg == "upstream"]
    # The journal frames the leg once (a server that closed or reset the connection
    # ends the response in flight there: it is recorded as far as it got).
    leg = journal.leg("upstream", keep_pieces=True, ended=bool(ended))
    request_heads = {message: head for message, _, _, head in leg.heads[Direction.UPSTREAM]}
    sent_at: dict[int, float] = {}
    bodies: dict[int, bytearray] = {}
    for framed in leg.pieces[Direction.UPSTREAM]:
        piece = framed.piece
        if piece.kind is PieceKind.BODY:
            bodies.setdefault(piece.message, bytearray()).extend(piece.data)
        if piece.end_of_message:
            end = piece.offset + max(len(piece.data) - 1, 0)
            sent_at[piece.message] = journal.time_at("upstream", "upstream", end)
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    # Split read by read, so each body piece stays within the read that brought it and
    # a write replays what the server flushed together, when it arrived.
    reads = sorted(r[5] for r in journal.records if r[1:4] == ("read", "upstream", "downstream"))
    pieces = _split_at([framed.piece for framed in leg.pieces[Direction.DOWNSTREAM]], reads)
    for piece in pieces:
        if piece.head is not None and piece.head.status is not None:
            if piece.head.is_interim:
                continue
            request_head = request_heads.get(piece.message)
            start = sent_at.get(piece.message, journal.started_at)
            current = {
                "status": piece.head.status,
                "headers": redaction.headers(piece.head.headers),
                "writes": [],
                "request": {
                    "method": request_head.method if request_head else None,
                    "target": redaction.target(request_head.target or "") if request_head else None,
                    "headers": redaction.headers(request_head.headers) if request_head else [],
                    "body": _request_body(bytes(bodies.get(piece.message, b"")), redaction),
                },
                "_start": start,
            }
        elif current is not None and piece.kind is PieceKind.BODY and piece.data:
            when = journal.time_at("upstream", "downstream", piece.offset) - current["_start"]
            writes = current["writes"]
            at = round(max(when, 0.0), 6)
            if writes and writes[-1][0] == at:
                writes[-1][1] += piece.data
            else:
                writes.append([at, bytearray(piece.data)])
        if current is not None and (piece.end_of_message or (piece is pieces[-1] and ended)):
            current.pop("_start")
            if not piece.end_of_message:
                current["truncated"] = ended[0]
            current["writes"] = [
                [at, base64.b64encode(bytes(data)).decode("ascii")]
                for at, data in current["writes"]
            ]
            out.append(current)
            current = None
    return out


def _split_at(pieces: list[Piece], starts: list[int]) -> list[Piece]:
    """BODY pieces cut where a read started (`starts`: stream offsets, sorted)."""
    out: list[Piece] = []
    for piece in pieces:
        if piece.kind is not PieceKind.BODY or len(piece.data) < 2:
            out.append(piece)
            continue
        begin, end = piece.offset, piece.offset + len(piece.data)
        cuts = (
            [c for c in starts[bisect.bisect_right(starts, begin) :] if c < end] if starts else []
        )
        edges = [begin, *cuts, end]
        for low, high in itertools.pairwise(edges):
            last = high == end
            out.append(
                Piece(
                    PieceKind.BODY,
                    piece.data[low - begin : high - begin],
                    piece.message,
                    low,
                    None,
                    piece.end_of_message and last,
                )
            )
    return out


class Recorder:
    """Writes the cassettes of every finished connection of a store, once each."""

    def __init__(self, store: JournalStore, out: Path) -> None:
        self.store = store
        self.out = out
        self.done: set[int] = set()
        self.written: list[Path] = []

    def finished(self, journal: ConnectionJournal) -> bool:
        """The response stream from the upstream has ended (FIN, RST or a failed write)."""
        return any(leg == "upstream" for leg, _, _ in journal.end_kinds)

    def flush(self, *, everything: bool = False) -> list[Path]:
        new: list[Path] = []
        for cid in sorted(self.store.journals):
            journal = self.store.journals[cid]
            if cid in self.done or not (everything or self.finished(journal)):
                continue
            self.done.add(cid)
            if not everything:
                del self.store.journals[cid]  # recorded: a long session keeps no bytes
            for number, cassette in enumerate(cassettes(journal)):
                self.out.mkdir(parents=True, exist_ok=True)
                path = self.out / f"cassette-{cid:04d}-{number}.json"
                path.write_text(json.dumps(cassette, indent=1))
                new.append(path)
        self.written += new
        return new


async def record(
    listen_address: Address,
    upstream: Address,
    out: Path,
    *,
    ready: Callable[[int], None] | None = None,
    on_cassette: Callable[[Path], None] | None = None,
    redaction: Redaction | None = None,
) -> Recorder:
    """Proxy to `upstream` without faults and record cassettes until cancelled;
    `redaction` (the journal's default rule unless given) blanks their secrets."""
    store = JournalStore(
        capture=True, max_connections=10_000, redaction=redaction or DEFAULT_REDACTION
    )
    recorder = Recorder(store, out)
    scenario = Scenario(name="record", description="pass-through recording")
    # A bare relay: what the upstream sends is what the cassette keeps.
    server = ProxyServer(proxy_config(upstream, scenario, journal=store, stages=None))
    listener = listen(listen_address)
    try:
        async with trio.open_nursery() as nursery:
            port = await nursery.start(server.serve, listener)
            if ready is not None:
                ready(port)
            while True:
                await trio.sleep(SCAN_INTERVAL)
                for path in recorder.flush():
                    if on_cassette is not None:
                        on_cassette(path)
    finally:
        listener.close()
        for path in recorder.flush(everything=True):
            if on_cassette is not None:
                on_cassette(path)
