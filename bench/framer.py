"""`python -m bench.framer`: the HTTP/1.1 framer's own cost, per piece of work, in one process.

The framer (`middlebox.core.http1.Http1Framer`) splits each direction of a connection into
labelled pieces; the relay's faulted path frames every stream once (`core/framed.py`).
This measures the framer alone on four inputs shaped like the proxy's traffic:

- `sse-per-read`: a chunked `text/event-stream` response, one SSE frame per chunk and one
  chunk per read (what a vLLM stream looks like at low load);
- `sse-batched`: the same bytes read 16 KiB at a time (many frames per read, under load);
- `bulk-64k`: keep-alive 64 KiB Content-Length responses read 16 KiB at a time;
- `pipelined-gets`: pipelined GET requests with eight fields each, read 4 KiB at a time.

and, for `sse-per-read`, the whole framing pass (`FramedStream.feed`: the HTTP framer
plus the SSE framer) so the framer's share of it shows. Each figure is the median of
`--repeats` timed passes over the input, in nanoseconds per unit (frame, response or
request). `--parser llhttp` also times a candidate built on llhttp, the C parser of
Node.js (`pip install llhttp==9.3.0.0`; not a dependency of middlebox), with the same
pieces out, and `--conformance` runs that candidate on every two-way split of every
shared conformance vector and counts where its pieces or its refusal differ from the
framer's. docs/performance.md ("C framing") has the method, a run and the decision.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from middlebox.core.framed import FramedStream
from middlebox.core.http1 import (
    Head,
    Http1Framer,
    Piece,
    PieceKind,
    Refusal,
    Role,
    coalesce,
    new_piece,
)
from middlebox.core.stream import Direction

FRAME = (
    b'data: {"id":"cmpl-8f3a","object":"text_completion","created":1733300000,'
    b'"model":"m","choices":[{"index":0,"text":" token","logprobs":null,'
    b'"finish_reason":null}]}\n\n'
)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Thu, 05 Dec 2026 00:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\n"
)
GET = (
    b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: bench/1\r\n"
    b"Accept: */*\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n"
    b"Authorization: Bearer token\r\nX-Request-Id: 0123456789abcdef\r\n"
    b"Content-Type: application/json\r\n\r\n"
)
BULK_BODY = 64 * 1024
READ = 16 * 1024


def _reads(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def workloads(frames: int) -> dict[str, tuple[Role, list[bytes], int, str]]:
    """Name: (role, the reads, how many units they hold, the unit)."""
    chunk = b"%x\r\n%s\r\n" % (len(FRAME), FRAME)
    per_read = [SSE_HEAD] + [chunk] * frames + [b"0\r\n\r\n"]
    sse = b"".join(per_read)
    responses = max(1, frames // 100)
    bulk_head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % BULK_BODY
    bulk = (bulk_head + b"x" * BULK_BODY) * responses
    gets = GET * frames
    return {
        "sse-per-read": ("response", per_read, frames, "frame"),
        "sse-batched": ("response", _reads(sse, READ), frames, "frame"),
        "bulk-64k": ("response", _reads(bulk, READ), responses, "response"),
        "pipelined-gets": ("request", _reads(gets, 4096), frames, "request"),
    }


def python_framer(role: Role) -> Any:
    return Http1Framer(role)


# -- the candidate: llhttp finds the boundaries ----------------------------------------
#
# llhttp reports no byte positions, so the candidate pauses the parser at each structural
# boundary (end of head, end of a chunk-size line, end of a chunk's CRLF, end of message):
# `execute` then returns how far it got, and the bytes up to there are the piece. Body
# bytes come first in a stretch between two pauses, structural bytes after them; the
# structural bytes are held until their pause, so a piece comes out whole however the
# input is split, as the framer's do. A head is parsed into `Head` by the framer's own
# parser once llhttp has found its end (the contract hands faults a parsed head). It does
# less than the framer, so its times are a lower bound for a C framer under the contract:
# no request-method queue (this binding ignores on_headers_complete's return value, so a
# response to HEAD cannot be told to have no body), none of the framer's framing checks
# on a head (`_body_mode`), and any refusal is llhttp's, with llhttp's reason.

_HEAD, _CHUNK_LINE, _CHUNK_END, _DONE = 1, 2, 3, 4


def llhttp_framer(role: Role) -> Any:
    import llhttp

    from middlebox.core.http1 import _parse_head

    base = llhttp.Request if role == "request" else llhttp.Response

    class Parser(base):  # type: ignore[misc, valid-type]
        event = 0
        body = 0

        def on_headers_complete(self) -> None:
            self.event = _HEAD
            self.pause()

        def on_chunk_header(self) -> None:
            self.event = _CHUNK_LINE
            self.pause()

        def on_chunk_complete(self) -> None:
            self.event = _CHUNK_END
            self.pause()

        def on_message_complete(self) -> None:
            self.event = _DONE
            self.pause()

        def on_body(self, data: memoryview) -> None:
            self.body += len(data)

    class LlhttpFramer:
        def __init__(self) -> None:
            self.parser = Parser()
            self.parser.lenient_optional_cr_before_lf = True  # bare LF (RFC 9112 §2.2)
            self.parser.lenient_spaces_after_chunk_size = True
            self.held = bytearray()
            self.message = 0
            self.offset = 0
            self.refusal: Refusal | None = None
            self.opaque = False
            self.last_chunk = False

        def _emit(self, out: list[Piece], kind: PieceKind, data: bytes, **kw: Any) -> None:
            out.append(new_piece(kind, data, self.message, self.offset, kw.get("head"), False))
            self.offset += len(data)

        def feed(self, data: bytes) -> list[Piece]:
            out: list[Piece] = []
            if self.opaque:
                if data:
                    self._emit(out, PieceKind.OPAQUE, bytes(data))
                return out
            parser = self.parser
            view = memoryview(data)
            pos = 0
            size = len(data)
            while True:
                parser.event = 0
                parser.body = 0
                try:
                    n = parser.execute(view[pos:] if pos else view)
                    if parser.event:
                        parser.unpause()
                        pos += n
                        self._on_event(out, parser.event, data[pos - n : pos])
                        continue
                except Exception as exc:  # llhttp.Error, or a head it passed and we do not
                    self._refuse(str(exc))
                    rest = bytes(self.held) + bytes(data[pos:])
                    self.held.clear()
                    self.opaque = True
                    if rest:
                        self._emit(out, PieceKind.OPAQUE, rest)
                    return out
                if n > size - pos:  # what the binding returns once llhttp has stopped
                    n = 0
                body = parser.body
                if body:
                    self._emit(out, PieceKind.BODY, bytes(data[pos : pos + body]))
                if n > body:
                    self.held += data[pos + body : pos + n]
                pos += n
                if parser.is_upgrading or pos < size:
                    # llhttp stops for good after an upgrade or CONNECT head (its
                    # HPE_PAUSED_UPGRADE): the rest of the stream is a tunnel
                    self.opaque = True
                    rest = bytes(self.held) + bytes(data[pos:])
                    self.held.clear()
                    if rest:
                        self._emit(out, PieceKind.OPAQUE, rest)
                return out

        def _on_event(self, out: list[Piece], event: int, stretch: bytes) -> None:
            parser = self.parser
            body = parser.body
            if body:
                self._emit(out, PieceKind.BODY, stretch[:body])
            held = bytes(self.held) + stretch[body:]
            self.held.clear()
            if event == _HEAD:
                start = len(held) - len(held.lstrip(b"\r\n"))
                try:
                    head: Head = _parse_head(held[start:], role)
                except ValueError:
                    self.held += held  # passed on as OPAQUE with the rest
                    raise
                self._emit(out, PieceKind.HEAD, held, head=head)
            elif event == _CHUNK_LINE:
                self.last_chunk = held.lstrip(b"0")[:1] in (b";", b"\r", b"\n", b" ", b"\t")
                kind = PieceKind.LAST_CHUNK if self.last_chunk else PieceKind.CHUNK_HEADER
                self._emit(out, kind, held)
            elif event == _CHUNK_END:
                if self.last_chunk:
                    self._emit(out, PieceKind.TRAILERS, held)
                else:
                    self._emit(out, PieceKind.CHUNK_TRAILER_CRLF, held)
            else:  # _DONE: the last piece of the message carries the end
                if held:
                    self._emit(out, PieceKind.BODY, held)
                if out:
                    out[-1] = _ended(out[-1])
                self.message += 1
                self.last_chunk = False

        def _refuse(self, reason: str) -> None:
            if self.refusal is None:
                self.refusal = Refusal(self.message, self.offset, self.offset, reason)

        def feed_eof(self) -> list[Piece]:
            out: list[Piece] = []
            if self.held:
                self._emit(out, PieceKind.OPAQUE, bytes(self.held))
                self.held.clear()
            return out

    return LlhttpFramer()


def _ended(piece: Piece) -> Piece:
    return new_piece(piece.kind, piece.data, piece.message, piece.offset, piece.head, True)


def llhttp_bare(role: Role) -> Any:
    """llhttp with no callbacks and no pieces: what the C parsing alone costs (a floor,
    not a framer: it says nothing of where anything is)."""
    import llhttp

    class Bare:
        def __init__(self) -> None:
            self.parser = (llhttp.Request if role == "request" else llhttp.Response)()
            self.execute = self.parser.execute

        def feed(self, data: bytes) -> list[Piece]:
            self.execute(data)
            return []

        def feed_eof(self) -> list[Piece]:
            return []

    return Bare()


PARSERS: dict[str, Callable[[Role], Any]] = {
    "python": python_framer,
    "llhttp": llhttp_framer,
    "llhttp-bare": llhttp_bare,
}


# -- timing ----------------------------------------------------------------------------


def run_once(make: Callable[[Role], Any], role: Role, reads: list[bytes]) -> tuple[float, int]:
    framer = make(role)
    feed = framer.feed
    count = 0
    start = time.thread_time_ns()
    for data in reads:
        count += len(feed(data))
    count += len(framer.feed_eof())
    return time.thread_time_ns() - start, count


def framed_stream_once(reads: list[bytes]) -> tuple[float, int]:
    stream = FramedStream(Direction.DOWNSTREAM)
    feed = stream.feed
    start = time.thread_time_ns()
    for data in reads:
        feed(data)
    return time.thread_time_ns() - start, 0


def median_ns(once: Callable[[], tuple[float, int]], repeats: int, units: int) -> float:
    times = [once()[0] / units for _ in range(repeats)]
    return statistics.median(times)


def bench(parsers: list[str], frames: int, repeats: int, only: str = "") -> Iterator[str]:
    for name, (role, reads, units, unit) in workloads(frames).items():
        if only and name != only:
            continue
        # the parsers take turns pass by pass, so a drift in the machine's speed falls on all
        times: dict[str, list[float]] = {parser: [] for parser in parsers}
        for _ in range(repeats):
            for parser in parsers:
                times[parser].append(run_once(PARSERS[parser], role, reads)[0] / units)
        medians = {parser: statistics.median(t) for parser, t in times.items()}
        line = f"{name:15} " + "  ".join(f"{p} {ns:9.0f} ns/{unit}" for p, ns in medians.items())
        if "python" in medians and len(medians) > 1:
            line += "  " + "  ".join(
                f"{p}/python {ns / medians['python']:.2f}x"
                for p, ns in medians.items()
                if p != "python"
            )
        yield line
        if name == "sse-per-read" and len(medians) > 1:
            whole = median_ns(lambda r=reads: framed_stream_once(r), repeats, units)
            yield f"{'':15} FramedStream.feed (HTTP + SSE framing) {whole:9.0f} ns/frame"


# -- the candidate on the shared conformance vectors ------------------------------------


def conformance(parser: str) -> Iterator[str]:
    from tests.conformance.test_vectors import cuts
    from tests.conformance.vectors import http_vectors

    make = PARSERS[parser]

    def frame(role: Role, parts: list[bytes], make: Callable[[Role], Any]) -> tuple[Any, Any]:
        framer = make(role)
        pieces: list[Piece] = []
        for part in parts:
            pieces += framer.feed(part)
        pieces += framer.feed_eof()
        canon = [(p.kind, p.data, p.message, p.end_of_message) for p in coalesce(pieces)]
        exact = b"".join(p.data for p in pieces) == b"".join(parts)
        return (canon, exact), framer.refusal is not None

    vectors = http_vectors()
    splits = inexact = differ = refusal_differs = differing = split_dependent = 0
    kinds: dict[str, int] = {}
    for vector in vectors:
        (want, _), want_refused = frame(vector.role, [vector.data], python_framer)
        seen: set[str] = set()
        outcomes: list[tuple[Any, bool]] = []
        for cut in [len(vector.data), *cuts(len(vector.data))]:
            parts = [vector.data[:cut], vector.data[cut:]]
            splits += 1
            (got, exact), refused = frame(vector.role, parts, make)
            if (got, refused) not in outcomes:
                outcomes.append((got, refused))
            inexact += not exact
            differ += got != want
            refusal_differs += refused != want_refused
            if refused and not want_refused:
                seen.add("the candidate refuses what the framer frames")
            elif want_refused and not refused:
                seen.add("the candidate frames what the framer refuses")
            elif got != want:
                seen.add("same verdict, other pieces")
        for kind in seen:
            kinds[kind] = kinds.get(kind, 0) + 1
        differing += bool(seen)
        split_dependent += len(outcomes) > 1
    yield (
        f"{parser}: {len(vectors)} vectors, {splits} splits; not byte-exact {inexact}, "
        f"pieces differ from the framer's {differ}, refused where the framer does not "
        f"(or the reverse) {refusal_differs}"
    )
    yield (
        f"  vectors with any difference: {differing}; framed or judged differently by the "
        f"candidate at different splits: {split_dependent}"
    )
    for kind, count in sorted(kinds.items()):
        yield f"  vectors where {kind}: {count}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.framer", description=__doc__)
    parser.add_argument("--parser", choices=sorted(PARSERS), action="append")
    parser.add_argument("--frames", type=int, default=2000, help="frames or requests a pass")
    parser.add_argument("--repeats", type=int, default=21, help="timed passes a figure")
    parser.add_argument("--conformance", action="store_true", help="the candidate's vectors")
    parser.add_argument("--alone", choices=sorted(PARSERS), help="time this parser only")
    parser.add_argument("--workload", choices=sorted(workloads(1)), help="this input only")
    args = parser.parse_args(argv)
    parsers = ["python", *[p for p in args.parser or [] if p != "python"]]
    if any(p.startswith("llhttp") for p in [*parsers, args.alone or ""]):
        try:
            import llhttp  # noqa: F401
        except ImportError:
            parser.error("the llhttp candidate needs `pip install llhttp==9.3.0.0`")
    if args.alone:
        parsers = [args.alone]  # one parser a process: for an A/B of whole processes
    for line in bench(parsers, args.frames, args.repeats, args.workload or ""):
        print(line, flush=True)
    if args.conformance:
        for name in parsers[1:]:
            if name == "llhttp-bare":
                continue  # frames nothing
            for line in conformance(name):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
