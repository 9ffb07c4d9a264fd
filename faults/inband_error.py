"""inband_error: an error frame in the event stream after N events, as a server that
fails mid-generation sends it.

Once vLLM's `StreamingResponse` has begun, the 200 and the headers are on the wire, so
a later failure (an engine error, a KV-load failure, `EngineDeadError`) is reported as
one `data: {"error": {...}}` frame followed by `data: [DONE]` and a proper chunked
end (reference §2.3). Clients must notice it although the status said 200: the
OpenAI SDK raises `APIError` on a data frame with an `error` key; naive clients
print the error as text or take the stream as complete.

`shape` picks the exact bytes:
- `vllm`: 0.33 chat, compact pydantic JSON, `{"error":{"message":"Internal server
  error","type":"InternalServerError","param":null,"code":500}}`;
- `vllm-spaced`: 0.33 completions and 0.10.1-0.11 (`json.dumps`, spaced; 0.10.1-0.11
  report BadRequestError/400 whatever the failure, set `error_type`/`code` for that);
- `vllm-legacy`: up to 0.10.0, with `"object": "error"` inside and BadRequestError/400;
- `openai`: OpenAI's `server_error` frame (spaced, `code: null`).

`events` counts dispatched data events of the response, `[DONE]` excluded; vLLM's
first event is the role chunk (`delta: {"role": "assistant"}`), so `events: 1` fails
before the first token. `after_tool_fragments: N` instead injects the frame after the
event carrying the Nth tool-call argument fragment: the server fails in the middle of a
tool call, whose arguments are not valid JSON yet (a client that executes what it has
acts on a partial call).

After the frame: `then: done` sends `data: [DONE]` and ends the chunked body (the
rest of the server's response is dropped, the connection stays usable); `close`
ends the connection without the last chunk (a truncated body) and closes toward the
server too, as a proxy giving up does; `continue` lets the server's events go on.
Each frame is its own chunk, as each `yield` is in vLLM. A Content-Length response is
left alone (its length is already on the wire) and reported as skipped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from faults._lib.checks import check_choice, check_positive
from faults._lib.sse_edit import SseBodyEditor, SseRewriter
from middlebox.core.dialects import read
from middlebox.core.fault import Fault
from middlebox.core.sse import SseKind, SsePiece

__all__ = ["InbandError", "error_frame"]

Shape = Literal["vllm", "vllm-spaced", "vllm-legacy", "openai"]
Then = Literal["done", "close", "continue"]

DONE_FRAME = b"data: [DONE]\n\n"

# shape -> (message, type, code) by default.
_DEFAULTS: dict[str, tuple[str, str, int | None]] = {
    "vllm": ("Internal server error", "InternalServerError", 500),
    "vllm-spaced": ("Internal server error", "InternalServerError", 500),
    "vllm-legacy": ("Internal server error", "BadRequestError", 400),
    "openai": (
        "The server had an error while processing your request. Sorry about that!",
        "server_error",
        None,
    ),
}


def error_frame(
    shape: Shape,
    message: str | None = None,
    error_type: str | None = None,
    code: int | None = None,
) -> bytes:
    """The exact `data: {"error": ...}\\n\\n` frame a `shape` server sends."""
    default_message, default_type, default_code = _DEFAULTS[shape]
    error: dict[str, Any] = {
        "message": message if message is not None else default_message,
        "type": error_type if error_type is not None else default_type,
        "param": None,
        "code": code if code is not None else default_code,
    }
    if shape == "vllm-legacy":
        error = {"object": "error", **error}
    if shape == "vllm":
        text = json.dumps({"error": error}, ensure_ascii=False, separators=(",", ":"))
    else:
        text = json.dumps({"error": error})
    return b"data: " + text.encode() + b"\n\n"


@dataclass
class InbandError(SseRewriter, Fault):
    """After `events` data events of a matched response, inject an error frame."""

    name: ClassVar[str] = "inband_error"

    events: int = 3
    shape: Shape = "vllm"
    message: str | None = None
    error_type: str | None = None
    code: int | None = None
    then: Then = "done"
    after_tool_fragments: int | None = None

    _seen: int = field(init=False, repr=False, compare=False, default=0)
    _fragments: int = field(init=False, repr=False, compare=False, default=0)
    _injected: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        check_positive("events", self.events, allow_zero=True)
        if self.after_tool_fragments is not None and self.after_tool_fragments < 1:
            raise ValueError(
                f"after_tool_fragments must be at least 1, got {self.after_tool_fragments!r}"
            )
        check_choice("shape", self.shape, Shape)
        check_choice("then", self.then, Then)

    @property
    def frame(self) -> bytes:
        return error_frame(self.shape, self.message, self.error_type, self.code)

    def begin(self, editor: SseBodyEditor, now: float) -> None:
        self._seen = self._fragments = 0
        self._injected = False
        if self.events == 0 and self.after_tool_fragments is None:
            self._inject(editor, 0, now)

    def edit(self, editor: SseBodyEditor, line: SsePiece, now: float) -> None:
        if line.kind is SseKind.BLANK and line.event is not None and not line.event.is_done:
            self._seen += 1
            self._fragments += read(line.event).tool_fragments
            if self.after_tool_fragments is None:
                reached = self._seen == self.events
            else:
                reached = not self._injected and self._fragments >= self.after_tool_fragments
            if reached:
                self._inject(editor, line.offset + len(line.data), now)

    def _inject(self, editor: SseBodyEditor, offset: int, now: float) -> None:
        self._injected = True
        editor.insert(offset, self.frame)
        details = {"tool_fragments": self._fragments} if self.after_tool_fragments else {}
        self.report(
            now,
            "injected",
            request=self.request_index,
            message=self.response_index,
            event=self._seen,
            body_offset=offset,
            then=self.then,
            **details,
        )
        if self.then == "done":
            editor.insert(offset, DONE_FRAME)
        if self.then != "continue":
            self.cut(editor, offset, last_chunk=self.then == "done", close=self.then == "close")
