"""The probe upstream's stream shapes: what a request asks for, and the exact writes it gets.

`middlebox probe-upstream` (middlebox/tools/probe_upstream.py) stands where the LLM server
stands and plays, per request, the stream shape the request asks for, so whatever sits
between a client and it (an ingress, a gateway, `middlebox proxy`) can be measured
against a known schedule. A shape is a list of knobs, `name=value` separated by `;`:

    frames=20;size=64;period=50ms;head_delay=800ms;pause_after=10;pause=5s;heartbeat=1s;
    end=done;framing=auto;format=chat;on_leave=stop;header=X-Accel-Buffering: no;id=run7-a

The same knobs travel in the `X-Middlebox-Probe` header, in the JSON body's
`middlebox_probe` field (a string as above or an object of knobs), or in the prompt (a
line `middlebox-probe: KNOBS` in the last message or in `prompt`): a gateway that strips
unknown headers or unknown body fields still passes the prompt.

This module is pure (no clock, no socket): `parse_knobs` checks a request's knobs (a
`ProbeSpecError` with a one-line message for a bad one), `ProbeShape.render` writes them
back, and `plan` gives every write of the response with the second it is due (counted from
the request's arrival) and its exact bytes. The server sleeps until each `at` and writes
`data`; the fingerprinter (and a virtual-clock test) reads the same plan to know what
the upstream sent and when, without asking it.

Frames: `frames` SSE events of exactly `size` bytes each (`data: ...\\n\\n` included),
the head `head_delay` after the request, frame k at `head_delay + k * period`, a pause of
`pause` after frame `pause_after` (0: after the head) during which a `: keep-alive` comment
goes out every `heartbeat`, then the end: `done` (`data: [DONE]` and the message's proper
end), `clean` (the proper end without `[DONE]`), `fin` (a close with the message cut:
no `[DONE]`, no last chunk, Content-Length short) or `rst` (a TCP reset). `retry=` puts
a `retry:` field after the head and `event_ids=yes` an `id:` line in each frame (within its
size), to see whether a path passes them. The text of frame k is seeded letters and digits
(seed k), so frames differ and a gzip hop compresses them about as much as model text.
`timeline` turns a plan into stream items for `faults.testing.replay`, and `request_for`
writes the request a fingerprinter sends (the knobs in the header and in the prompt).
"""

from __future__ import annotations

import json
import random
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

from middlebox.core.stream import DOWN, UP, Chunk, Eof, Item, Reset
from middlebox.scenario.units import format_duration, parse_duration, parse_size

HEADER = "X-Middlebox-Probe"
BODY_FIELD = "middlebox_probe"
PROMPT_MARK = "middlebox-probe:"

DONE = b"data: [DONE]\n\n"
HEARTBEAT = b": keep-alive\n\n"  # vLLM sends none; the emulator's and sse-starlette's shape
LAST_CHUNK = b"0\r\n\r\n"
TEXT_ALPHABET = string.ascii_letters + string.digits + " "

End = Literal["done", "clean", "fin", "rst"]
Framing = Literal["auto", "chunked", "close", "length"]
Format = Literal["chat", "completion", "text"]
OnLeave = Literal["stop", "ignore"]
ENDS: tuple[End, ...] = ("done", "clean", "fin", "rst")
FRAMINGS: tuple[Framing, ...] = ("auto", "chunked", "close", "length")
FORMATS: tuple[Format, ...] = ("chat", "completion", "text")
ON_LEAVE: tuple[OnLeave, ...] = ("stop", "ignore")

# Bounds a deployed probe keeps, whoever sends the knobs: a stream of at most two hours and
# 1 GiB, so a typo (`pause=1e5s`) is a clear 400 and not a thread held for a day.
MAX_FRAMES = 1_000_000
MAX_FRAME_SIZE = 1024 * 1024
MAX_WAIT = 3600.0
MAX_DURATION = 7200.0
MAX_BYTES = 1024**3
MIN_HEARTBEAT = 0.001
MAX_HEADERS = 16
_ID = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+\Z")
_HEADER_VALUE = re.compile(r"[\x20-\x7e\t]*\Z")
# Headers the probe writes itself (the framing): a knob may not set them
_OWN_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})


class ProbeSpecError(ValueError):
    """A knob the probe cannot play: the message is one line, naming the knob."""


@dataclass(frozen=True)
class ProbeShape:
    """One response's shape (see the module docstring); defaults are a short stream a
    plain OpenAI client can read. `size` None: the format's smallest frame plus 40
    characters of text."""

    frames: int = 20
    size: int | None = None
    period: float = 0.05
    head_delay: float = 0.0
    pause_after: int | None = None
    pause: float = 0.0
    heartbeat: float | None = None
    end: End = "done"
    framing: Framing = "auto"
    format: Format | None = None  # None: chat on the chat route, completion on completions
    on_leave: OnLeave = "stop"
    retry: float | None = None
    event_ids: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    id: str | None = None

    def render(self) -> str:
        """The knobs that differ from the defaults, in the header's syntax (what
        `parse_knobs` reads back to an equal shape)."""
        parts: list[str] = []
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value == spec.default:
                continue
            if spec.name == "headers":
                parts += [f"header={name}: {text}" for name, text in value]
            elif spec.name == "event_ids":
                parts.append(f"event_ids={'yes' if value else 'no'}")
            elif spec.name in _DURATIONS:
                parts.append(f"{spec.name}={format_duration(value)}")
            else:
                parts.append(f"{spec.name}={value}")
        return ";".join(parts)

    @property
    def duration(self) -> float:
        """Seconds from the request to the last write of the plan."""
        return self.head_delay + self.frames * self.period + self.pause


_DURATIONS = frozenset({"period", "head_delay", "pause", "heartbeat", "retry"})
KNOBS = (
    "frames", "size", "period", "head_delay", "pause_after", "pause", "heartbeat", "end",
    "framing", "format", "on_leave", "retry", "event_ids", "header", "id",
)  # fmt: skip


def split_knobs(text: str) -> list[tuple[str, str]]:
    """`a=1;b=2` -> [("a", "1"), ("b", "2")]; spaces around names and values dropped."""
    pairs: list[tuple[str, str]] = []
    for part in text.split(";"):
        if not part.strip():
            continue
        name, equals, value = part.partition("=")
        if not equals:
            raise ProbeSpecError(f"probe knob {part.strip()!r} has no '=': write name=value")
        pairs.append((name.strip(), value.strip()))
    return pairs


def parse_knobs(knobs: str | Mapping[str, object] | list[tuple[str, str]]) -> ProbeShape:
    """A shape from knobs (header syntax, a JSON object, or name/value pairs); a bad
    knob raises ProbeSpecError naming it, the value and what is expected."""
    if isinstance(knobs, str):
        pairs: list[tuple[str, object]] = list(split_knobs(knobs))
    elif isinstance(knobs, Mapping):
        pairs = []
        for name, value in knobs.items():
            if name == "header" and isinstance(value, Mapping):
                pairs += [("header", f"{n}: {v}") for n, v in value.items()]
            elif name == "header" and isinstance(value, list):
                pairs += [("header", item) for item in value]
            else:
                pairs.append((name, value))
    else:
        pairs = list(knobs)
    values: dict[str, object] = {}
    headers: list[tuple[str, str]] = []
    for name, value in pairs:
        if name not in KNOBS:
            raise ProbeSpecError(f"unknown probe knob {name!r} (knobs: {', '.join(KNOBS)})")
        try:
            if name == "header":
                headers.append(_header(value))
            elif name in values:
                raise ValueError("given twice")
            else:
                values[name] = _knob(name, value)
        except ValueError as error:
            raise ProbeSpecError(f"probe knob {name}={value}: {error}") from None
    if len(headers) > MAX_HEADERS:
        raise ProbeSpecError(f"probe knob header: at most {MAX_HEADERS} headers")
    shape = ProbeShape(headers=tuple(headers), **values)  # type: ignore[arg-type]
    return _checked(shape)


def _knob(name: str, value: object) -> object:
    text = str(value).strip()
    if name in ("frames", "pause_after"):
        if isinstance(value, bool) or not re.fullmatch(r"[0-9]+", text):
            raise ValueError("expected a whole number")
        number = int(text)
        if number > MAX_FRAMES:
            raise ValueError(f"at most {MAX_FRAMES}")
        return number
    if name == "size":
        size = parse_size(value)
        if size > MAX_FRAME_SIZE:
            raise ValueError(f"a frame is at most {MAX_FRAME_SIZE} bytes")
        return size
    if name in _DURATIONS:
        seconds = parse_duration(value)
        if seconds > MAX_WAIT:
            raise ValueError(f"at most {format_duration(MAX_WAIT)}")
        if name == "heartbeat" and seconds < MIN_HEARTBEAT:
            raise ValueError(f"at least {format_duration(MIN_HEARTBEAT)}")
        return seconds
    if name == "event_ids":
        if isinstance(value, bool):
            return value
        if text not in ("yes", "no"):
            raise ValueError("expected yes or no")
        return text == "yes"
    choices: dict[str, tuple[str, ...]] = {
        "end": ENDS, "framing": FRAMINGS, "format": FORMATS, "on_leave": ON_LEAVE,
    }  # fmt: skip
    if name in choices:
        if text not in choices[name]:
            raise ValueError(f"expected one of {', '.join(choices[name])}")
        return text
    if not _ID.match(text):
        raise ValueError("an id is 1-64 letters, digits, '.', '_' or '-'")
    return text


def _header(value: object) -> tuple[str, str]:
    name, colon, text = str(value).partition(":")
    name, text = name.strip(), text.strip()
    if not colon or not _HEADER_NAME.match(name) or not _HEADER_VALUE.match(text):
        raise ValueError("expected 'Name: value' (a token name, a printable value)")
    if name.lower() in _OWN_HEADERS:
        raise ValueError(f"{name} is the probe's own (set it with framing=)")
    return name, text


def _checked(shape: ProbeShape) -> ProbeShape:
    if shape.pause_after is not None and shape.pause_after > shape.frames:
        raise ProbeSpecError(
            f"probe knob pause_after={shape.pause_after}: the stream has only "
            f"{shape.frames} frames (pause_after=0 pauses after the head)"
        )
    if shape.pause and shape.pause_after is None:
        raise ProbeSpecError("probe knob pause: needs pause_after= (the frame it follows)")
    if shape.heartbeat is not None and not shape.pause:
        raise ProbeSpecError("probe knob heartbeat: sends comments during a pause; set pause=")
    if shape.duration > MAX_DURATION:
        raise ProbeSpecError(
            f"probe shape lasts {shape.duration:g}s: at most {format_duration(MAX_DURATION)}"
        )
    if shape.size is not None and shape.frames * shape.size > MAX_BYTES:
        raise ProbeSpecError(f"probe shape sends {shape.frames * shape.size} bytes: at most 1GiB")
    return shape


# -- the frames -------------------------------------------------------------------------------


def frame_prefix_suffix(fmt: Format, ident: str, model: str) -> tuple[bytes, bytes]:
    """The bytes of a frame around its text: `data: ` + JSON up to the text, and after it."""
    if fmt == "text":
        return b'data: {"text":"', b'"}\n\n'
    name = json.dumps(model)
    if fmt == "chat":
        head = (
            f'{{"id":"chatcmpl-{ident}","object":"chat.completion.chunk","created":0,'
            f'"model":{name},"choices":[{{"index":0,"delta":{{"content":"'
        )
        tail = '"},"finish_reason":null}]}'
    else:
        head = (
            f'{{"id":"cmpl-{ident}","object":"text_completion","created":0,'
            f'"model":{name},"choices":[{{"index":0,"text":"'
        )
        tail = '","finish_reason":null}]}'
    return b"data: " + head.encode(), tail.encode() + b"\n\n"


def smallest_frame(fmt: Format, ident: str, model: str, event_id: int | None = None) -> int:
    prefix, suffix = frame_prefix_suffix(fmt, ident, model)
    return len(prefix) + len(suffix) + len(_id_line(event_id))


def _id_line(event_id: int | None) -> bytes:
    """An SSE `id:` line (what a reconnecting EventSource sends back as Last-Event-ID)."""
    return b"" if event_id is None else b"id: %d\n" % event_id


def frame_size(shape: ProbeShape, ident: str, model: str) -> int:
    """The bytes of every frame of `shape` for this request (`size`, or the default)."""
    fmt = shape.format or "chat"
    least = smallest_frame(fmt, ident, model, shape.frames if shape.event_ids else None)
    if shape.size is None:
        return least + 40
    if shape.size < least:
        smaller = smallest_frame("text", ident, model, shape.frames if shape.event_ids else None)
        hint = f" (format=text frames go down to {smaller})" if smaller < least else ""
        raise ProbeSpecError(
            f"probe knob size={shape.size}: a {fmt} frame here is at least {least} bytes{hint}"
        )
    return shape.size


def frame(
    index: int,
    size: int,
    fmt: Format = "text",
    ident: str = "",
    model: str = "",
    event_id: int | None = None,
) -> bytes:
    """Frame `index`: one `data:` event of exactly `size` bytes (with its `id:` line when
    `event_id` is given), its text seeded letters and digits (seed: the frame's number)."""
    prefix, suffix = frame_prefix_suffix(fmt, ident, model)
    prefix = _id_line(event_id) + prefix
    room = size - len(prefix) - len(suffix)
    text = "".join(random.Random(index).choices(TEXT_ALPHABET, k=room))
    return prefix + text.encode() + suffix


# -- the plan ---------------------------------------------------------------------------------

WriteKind = Literal["head", "retry", "frame", "heartbeat", "done", "last-chunk"]


@dataclass(frozen=True)
class Write:
    """One write of the response: due `at` seconds after the request arrived; `data` is
    exactly what goes on the wire (chunk framing included); `index` numbers frames."""

    at: float
    kind: WriteKind
    data: bytes
    index: int = -1


@dataclass(frozen=True)
class Plan:
    """Every write of one response, then how it ends (`end`: done, clean, fin, rst; at
    `end_at`, after a pause that follows the last frame) and whether the connection stays
    open for the next request (`keep_alive`). `content_length`: what the head declares
    (length framing), the whole body with `[DONE]` (so `fin` and `rst` leave it short)."""

    framing: Literal["chunked", "close", "length"]
    writes: tuple[Write, ...]
    end: End
    end_at: float
    keep_alive: bool
    frame_bytes: int
    content_length: int | None = None

    @property
    def frames(self) -> int:
        return sum(1 for write in self.writes if write.kind == "frame")


def chosen_framing(shape: ProbeShape, http10: bool) -> Literal["chunked", "close", "length"]:
    """`auto`: an HTTP/1.0 request close-delimited (it cannot read chunks; uvicorn and
    vLLM answer it so), an HTTP/1.1 one chunked."""
    if shape.framing == "auto":
        return "close" if http10 else "chunked"
    if shape.framing == "chunked" and http10:
        raise ProbeSpecError(
            "probe knob framing=chunked: this request is HTTP/1.0, which cannot read chunks "
            "(use framing=close or framing=length)"
        )
    return shape.framing


def plan(
    shape: ProbeShape, *, http10: bool, ident: str, model: str, keep_alive: bool = True
) -> Plan:
    """Every write of `shape`'s response to one request, each with its due second (the
    schedule is absolute: a late write does not shift the next)."""
    framing = chosen_framing(shape, http10)
    size = frame_size(shape, ident, model)
    body: list[tuple[float, WriteKind, bytes, int]] = []
    at = shape.head_delay

    def wait(start: float) -> float:
        beat = 1
        end = start + shape.pause
        # a comment due within 1 ms of the pause's end would go out with the next frame
        while shape.heartbeat and (due := start + beat * shape.heartbeat) < end - 0.001:
            body.append((due, "heartbeat", HEARTBEAT, -1))
            beat += 1
        return end

    if shape.retry is not None:
        body.append((at, "retry", b"retry: %d\n\n" % round(shape.retry * 1000), -1))
    if shape.pause_after == 0:
        at = wait(at)
    fmt = shape.format or "chat"
    for index in range(shape.frames):
        at += shape.period
        event_id = index + 1 if shape.event_ids else None
        body.append((at, "frame", frame(index, size, fmt, ident, model, event_id), index))
        if shape.pause_after is not None and index + 1 == shape.pause_after:
            at = wait(at)
    ending: list[tuple[float, WriteKind, bytes, int]] = []
    if shape.end in ("done", "fin", "rst"):
        ending.append((at, "done", DONE, -1))
    whole = sum(len(data) for _, _, data, _ in body + ending)
    if shape.end in ("fin", "rst"):
        ending = []  # the message is cut where [DONE] was due
    keep = keep_alive and framing != "close" and shape.end in ("done", "clean")
    head = _head(shape, framing, whole, keep)
    writes = [Write(shape.head_delay, "head", head)]
    for due, kind, data, index in body + ending:
        wire = b"%x\r\n%s\r\n" % (len(data), data) if framing == "chunked" else data
        writes.append(Write(due, kind, wire, index))
    if framing == "chunked" and shape.end in ("done", "clean"):
        writes.append(Write(at, "last-chunk", LAST_CHUNK))
    declared = whole if framing == "length" else None
    return Plan(framing, tuple(writes), shape.end, at, keep, size, declared)


def _head(shape: ProbeShape, framing: str, length: int, keep_alive: bool) -> bytes:
    lines = [b"HTTP/1.1 200 OK", b"content-type: text/event-stream; charset=utf-8"]
    lines += [f"{name}: {value}".encode("latin-1") for name, value in shape.headers]
    if framing == "close":
        lines.append(b"connection: close")  # close-delimited, as uvicorn answers HTTP/1.0
    elif framing == "chunked":
        lines.append(b"transfer-encoding: chunked")
    else:
        lines.append(b"content-length: %d" % length)
    if framing != "close" and not keep_alive:
        lines.append(b"connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def timeline(played: Plan, request: bytes) -> list[tuple[float, Item]]:
    """The exchange as stream items on the virtual clock (`faults.testing.replay`'s input):
    the request at 0, each write at its due second, then the upstream's end (a FIN for a
    close-delimited body or a cut, an RST for `rst`; nothing while a kept-alive connection
    waits for its next request). What the probe upstream writes, without a socket."""
    items: list[tuple[float, Item]] = [(0.0, Chunk(UP, request))]
    items += [(write.at, Chunk(DOWN, write.data)) for write in played.writes]
    if played.end == "rst":
        items.append((played.end_at, Reset(DOWN)))
    elif not played.keep_alive:
        items.append((played.end_at, Eof(DOWN)))
    return items


def request_for(
    shape: ProbeShape,
    *,
    host: str,
    path: str = "/v1/chat/completions",
    model: str = "middlebox-probe",
    http10: bool = False,
    extra_headers: tuple[tuple[str, str], ...] = (),
) -> bytes:
    """A streamed chat request asking for `shape` in both places a fingerprinter uses: the
    header (the plainest) and a prompt line (what passes every gateway a chat passes)."""
    knobs = shape.render()
    content = f"{PROMPT_MARK} {knobs}"
    body = json.dumps(
        {"model": model, "stream": True, "messages": [{"role": "user", "content": content}]}
    ).encode()
    lines = [
        f"POST {path} HTTP/{'1.0' if http10 else '1.1'}",
        f"Host: {host}",
        f"{HEADER}: {knobs}",
        "Content-Type: application/json",
        "Accept: text/event-stream",
        *(f"{name}: {value}" for name, value in extra_headers),
        f"Content-Length: {len(body)}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


# -- where the knobs came from ----------------------------------------------------------------


def knobs_in_request(
    header: str | None, body: object
) -> tuple[str, str | Mapping[str, object] | None]:
    """(source, knobs) of a request: the header first, then the body's field, then a
    `middlebox-probe:` line in the prompt; ("default", None) when none carries knobs."""
    if header is not None and header.strip():
        return "header", header
    if isinstance(body, Mapping):
        value = body.get(BODY_FIELD)
        if isinstance(value, str | Mapping):
            return "body", value
        if value is not None:
            raise ProbeSpecError(f"{BODY_FIELD}: expected a string of knobs or an object")
        for text in _prompts(body):
            for line in text.splitlines():
                if line.strip().startswith(PROMPT_MARK):
                    return "prompt", line.strip()[len(PROMPT_MARK) :]
    return "default", None


def _prompts(body: Mapping[str, object]) -> list[str]:
    """The prompt text: `prompt` (completions), the last message's content (chat)."""
    found: list[str] = []
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        found.append(prompt)
    messages = body.get("messages")
    if isinstance(messages, list) and messages and isinstance(messages[-1], Mapping):
        content = messages[-1].get("content")
        if isinstance(content, str):
            found.append(content)
        elif isinstance(content, list):
            found += [p["text"] for p in content if isinstance(p, Mapping) and "text" in p]
    return [text for text in found if isinstance(text, str)]
