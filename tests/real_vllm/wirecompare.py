"""Compare two servers' HTTP answers on the wire, masking what must differ (pure, stdlib only).

One `Exchange` is what a raw HTTP/1.1 client saw: the status line, the header names and values in
order, and the body. `shape()` reduces it to what a faithful emulator must reproduce exactly:

* the status line, and the header names in order (values too, except `date` and `content-length`);
* for JSON bodies and each SSE frame: the keys in order at every level, the JSON spacing style
  (compact pydantic vs spaced `json.dumps`), the literal values of everything else;
* masked: ids, `created`, generated text, token counts and `system_fingerprint`'s hash, and the
  digits inside error messages (token counts of the prompt in a context-length error).

Streams are normalised so that timing cannot make two identical servers differ: frames are
ordered by choice index (n>1 interleaves as the engine schedules), and plain token frames are
compared as a set of distinct shapes, since how many there are (and whether the API consumer
merged some) is not the wire format.

`compare(expected, actual)` returns human-readable differences; empty means the same.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TEXT_KEYS = {"content", "text", "reasoning", "reasoning_content", "delta"}
COUNT_KEYS = {"prompt_tokens", "completion_tokens", "total_tokens", "cached_tokens", "created",
              "created_at", "input_tokens", "output_tokens", "sequence_number"}  # fmt: skip
# Anthropic's stop reasons are the API's words; any other `stop_reason` is a matched stop string.
ANTHROPIC_STOP_REASONS = {"end_turn", "max_tokens", "stop_sequence", "tool_use"}
# Named events that carry one step's text (the Responses API's and Anthropic's token frames).
TOKEN_EVENTS = {b"response.output_text.delta", b"content_block_delta"}
ID_KEYS = {"id", "item_id"}
VARIABLE_HEADERS = {"date", "content-length"}


@dataclass(frozen=True)
class Exchange:
    status_line: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @property
    def content_type(self) -> str:
        for name, value in self.headers:
            if name.lower() == "content-type":
                return value
        return ""


def fetch(
    url: str, method: str = "GET", path: str = "/", body: Any = None, timeout: float = 120.0
) -> Exchange:
    """One request over a fresh connection, read to the end (http.client keeps header order)."""
    host, port = _host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        headers = {}
        payload = None
        if body is not None:
            payload = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        data = response.read()
        version = {10: "HTTP/1.0", 11: "HTTP/1.1"}.get(response.version, str(response.version))
        return Exchange(
            f"{version} {response.status} {response.reason}",
            tuple((k.lower(), v) for k, v in response.getheaders()),
            data,
        )
    finally:
        conn.close()


# The tier's model samples at temperature 1 where a request names none, and about one answer
# in fifty of its 4 random tokens decodes to no text (byte pieces the detokeniser holds back,
# special tokens it skips). vLLM then writes no text part: a Responses message with
# `"content":[]` (serving.py `if final_output.text`), a stream without `output_item.added`,
# a Messages answer without a text block. Which text the model samples is masked; whether it
# sampled any is part of the same draw, so such an answer is asked for again.
RESAMPLES = 8
OUTPUT_COUNT_KEYS = ("completion_tokens", "output_tokens")


def _json_values(exchange: Exchange) -> list[Any]:
    """The body's JSON document, or each SSE frame's."""
    if exchange.content_type.startswith("text/event-stream"):
        return frame_values(exchange.body)
    try:
        return [json.loads(exchange.body)]
    except ValueError:
        return []


def _leaves(value: Any, key: str | None = None) -> list[tuple[str | None, Any]]:
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _leaves(v, k)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v, key)]
    return [(key, value)]


def sampled_no_text(exchange: Exchange) -> bool:
    """A successful answer that generated tokens and carries no text of them, nor arguments."""
    status = exchange.status_line.split(" ")
    if len(status) < 2 or not status[1].startswith("2"):
        return False
    leaves = _all_leaves(exchange)
    generated = any(k in OUTPUT_COUNT_KEYS and isinstance(v, int) and v > 0 for k, v in leaves)
    return generated and not _text_in(leaves)


def carries_text(exchange: Exchange) -> bool:
    """The answer (a body, or a stream's frames) carries generated text or tool arguments."""
    return _text_in(_all_leaves(exchange))


def _all_leaves(exchange: Exchange) -> list[tuple[str | None, Any]]:
    return [leaf for value in _json_values(exchange) for leaf in _leaves(value)]


def _text_in(leaves: list[tuple[str | None, Any]]) -> bool:
    return any(k in TEXT_KEYS | {"arguments"} and isinstance(v, str) and v for k, v in leaves)


def fetch_sampled(
    url: str, method: str = "GET", path: str = "/", body: Any = None, timeout: float = 120.0
) -> Exchange:
    """`fetch`, asked again (at most RESAMPLES times) while the model sampled no text."""
    for _ in range(RESAMPLES):
        answer = fetch(url, method, path, body, timeout)
        if not sampled_no_text(answer):
            break
    return answer


def _host_port(url: str) -> tuple[str, int]:
    match = re.match(r"^http://([^/:]+):(\d+)", url)
    if not match:
        raise ValueError(f"not an http://host:port URL: {url}")
    return match.group(1), int(match.group(2))


# ------------------------------------------------------------------------ shapes


def spacing(raw: str, parsed: Any) -> str:
    """Which serializer wrote `raw`: pydantic/Starlette (compact) or json.dumps (spaced)."""
    for style, separators in (("compact", (",", ":")), ("spaced", (", ", ": "))):
        for ascii_only in (False, True):
            if json.dumps(parsed, separators=separators, ensure_ascii=ascii_only) == raw:
                return style + ("+ascii" if ascii_only and not raw.isascii() else "")
    return "other"


def skeleton(value: Any, key: str | None = None) -> Any:
    """The JSON value with masked leaves; objects become lists of (key, value) to keep order."""
    if isinstance(value, dict):
        return ("{}", tuple((k, skeleton(v, k)) for k, v in value.items()))
    if isinstance(value, list):
        return ("[]", tuple(skeleton(v, key) for v in value))
    if key in ID_KEYS and isinstance(value, str):
        return "<id:" + re.sub(r"[0-9a-f]", "h", value) + ">"
    if key in TEXT_KEYS and isinstance(value, str):
        # Empty too: a byte token the detokeniser holds back is a real `"content":""` chunk.
        return "<text>"
    if key in COUNT_KEYS and isinstance(value, int) and not isinstance(value, bool):
        return "<n>"
    if key == "system_fingerprint" and isinstance(value, str):
        return re.sub(r"-[0-9a-f]{8}$", "-<hash>", value)
    if key in ("message", "msg") and isinstance(value, str):
        return re.sub(r"\d+", "<d>", value)
    if key == "input" and isinstance(value, (str, int)):
        return "<input>"
    if key == "stop_reason" and isinstance(value, str) and value not in ANTHROPIC_STOP_REASONS:
        return "<stop string>"  # the matched string: a piece of the generated text
    if key == "root" and isinstance(value, str):
        return "<model path>"  # /v1/models: where the weights lie, a deployment detail
    return value


def body_shape(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
        parsed = json.loads(text, object_pairs_hook=dict)
    except (UnicodeDecodeError, ValueError):
        return ("raw", raw)
    return ("json", spacing(text, parsed), skeleton(parsed))


def frames(body: bytes) -> list[bytes]:
    """SSE frames: vLLM writes `data: <json>\\n\\n`, or `event: <type>\\ndata: <json>\\n\\n`
    on its Responses and Messages streams."""
    parts = body.split(b"\n\n")
    if parts and parts[-1] == b"":
        parts.pop()
    else:
        parts.append(b"<unterminated>")
    return parts


def _frame_shape(frame: bytes) -> Any:
    if frame.startswith(b"event: ") and b"\ndata: " in frame:
        name, _, payload = frame[len(b"event: ") :].partition(b"\ndata: ")
        return ("event", name, body_shape(payload))
    if not frame.startswith(b"data: "):
        return ("not-data", frame[:40])
    payload = frame[len(b"data: ") :]
    if payload == b"[DONE]":
        return ("done",)
    return body_shape(payload)


def _choice_order(shape: Any, position: int) -> tuple[int, int, int]:
    """Sort key: role chunks first, then by choice index, keeping each choice's own order."""
    try:
        obj = dict(shape[2][1])
        choices = obj.get("choices")
        items: Any = choices[1] if choices else ()
        if len(items) == 1:
            choice = dict(items[0][1])
            delta = choice.get("delta")
            is_role = delta is not None and "role" in dict(delta[1])
            return (0 if is_role else 1, int(choice["index"]), position)
    except (IndexError, KeyError, TypeError, ValueError):
        pass
    return (2, 0, position)


def _is_content(shape: Any) -> bool:
    """A token frame that is neither a role chunk nor a finish chunk."""
    if shape[0] == "event":
        return bool(shape[1] in TOKEN_EVENTS)
    if _choice_order(shape, 0)[0] != 1:
        return False
    choice = dict(dict(shape[2][1])["choices"][1][0][1])
    return choice.get("finish_reason") is None


def stream_shape(body: bytes) -> tuple[list[Any], list[Any]]:
    """(the frames in order without plain token frames, the distinct token-frame shapes).

    Plain token frames are set apart because their number is not the wire format: it is the
    token count, and a lagging consumer merges outputs (on a loaded machine the emulator and vLLM
    both do), down to none before the finish chunk. Their shapes are still compared.
    """
    shapes = [_frame_shape(f) for f in frames(body)]
    ordered = [s for _, s in sorted(((_choice_order(s, i), s) for i, s in enumerate(shapes)),
                                    key=lambda pair: pair[0])]  # fmt: skip
    kept: list[Any] = []
    content: list[Any] = []
    for item in ordered:
        if _is_content(item):
            if item not in content:
                content.append(item)
        else:
            kept.append(item)
    return kept, content


def frame_values(body: bytes) -> list[Any]:
    """Each SSE frame's `data:` JSON, in order; a frame without one (`[DONE]`, a comment, a
    frame a read cut short) is left out."""
    values = []
    for frame in frames(body):
        try:
            values.append(json.loads(frame.partition(b"data: ")[2]))
        except ValueError:
            continue
    return values


def sequence_numbers(body: bytes) -> list[int]:
    """The `sequence_number` of each Responses event, in order."""
    return [
        value["sequence_number"]
        for value in frame_values(body)
        if isinstance(value, dict) and isinstance(value.get("sequence_number"), int)
    ]


def _sequence_difference(want: bytes, got: bytes, prefix: str) -> str | None:
    """Both count their events alike: consecutive, from the same first number. (The numbers
    themselves are masked: how many token events there are is not the wire format.)"""
    w, g = sequence_numbers(want), sequence_numbers(got)
    if not w and not g:
        return None
    if g and g != list(range(g[0], g[0] + len(g))):
        return f"{prefix}sequence_number not consecutive: {g[:40]}"
    if w[:1] != g[:1]:
        return f"{prefix}first sequence_number {g[:1]}, expected {w[:1]}"
    return None


def shape(exchange: Exchange) -> dict[str, Any]:
    headers = [
        (name, "<masked>" if name in VARIABLE_HEADERS else value)
        for name, value in exchange.headers
    ]
    if exchange.content_type.startswith("text/event-stream"):
        body: Any = ("sse", stream_shape(exchange.body))
    elif exchange.content_type.startswith("application/json"):
        body = body_shape(exchange.body)
    else:
        body = ("raw", exchange.body)
    return {"status": exchange.status_line, "headers": headers, "body": body}


# ------------------------------------------------------------------------ metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+\S+")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
# Label values that name the deployment rather than vLLM's behaviour.
MASKED_LABELS = {"model_name", "engine", "le", "num_gpu_blocks", "num_cpu_blocks"}


def metric_families(text: str, prefix: str = "vllm:") -> dict[str, dict[str, Any]]:
    """{family: {type, samples: {sample name: sorted label names}, labels: {name: values}}}."""
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            if name.startswith(prefix):
                out.setdefault(name, {"type": kind, "samples": {}, "labels": {}})["type"] = kind
            continue
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match or not match.group(1).startswith(prefix):
            continue
        sample = match.group(1)
        family = _family_of(sample, out)
        labels = dict(_LABEL.findall(match.group(3) or ""))
        entry = out.setdefault(family, {"type": "untyped", "samples": {}, "labels": {}})
        entry["samples"].setdefault(sample, set()).update(labels)
        for label, value in labels.items():
            if label not in MASKED_LABELS:
                entry["labels"].setdefault(label, set()).add(value)
    return out


def _family_of(sample: str, known: dict[str, Any]) -> str:
    if sample in known:
        return sample
    for suffix in ("_total", "_created", "_bucket", "_sum", "_count"):
        if sample.endswith(suffix) and sample[: -len(suffix)] in known:
            return sample[: -len(suffix)]
    return sample


def compare_metrics(expected: str, actual: str) -> list[str]:
    want, got = metric_families(expected), metric_families(actual)
    diffs = []
    for name in sorted(set(want) - set(got)):
        diffs.append(f"/metrics: missing family {name} ({want[name]['type']})")
    for name in sorted(set(got) - set(want)):
        diffs.append(f"/metrics: extra family {name} ({got[name]['type']})")
    for name in sorted(set(want) & set(got)):
        w, g = want[name], got[name]
        if w["type"] != g["type"]:
            diffs.append(f"/metrics: {name} is a {g['type']}, expected {w['type']}")
        ws = {k: sorted(v) for k, v in w["samples"].items()}
        gs = {k: sorted(v) for k, v in g["samples"].items()}
        if ws != gs:
            diffs.append(f"/metrics: {name} samples/labels {gs}, expected {ws}")
        for label in sorted(w["labels"].keys() & g["labels"].keys()):
            if w["labels"][label] != g["labels"][label]:
                diffs.append(
                    f"/metrics: {name} label {label} values {sorted(g['labels'][label])}, "
                    f"expected {sorted(w['labels'][label])}"
                )
    return diffs


# ------------------------------------------------------------------------ compare


def _first_difference(want: Any, got: Any, where: str) -> str | None:
    if want == got:
        return None
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        for i, (w, g) in enumerate(zip(want, got, strict=False)):
            found = _first_difference(w, g, f"{where}[{i}]")
            if found:
                return found
        if len(want) != len(got):
            extra = want[len(got) :] if len(want) > len(got) else got[len(want) :]
            return f"{where}: length {len(got)}, expected {len(want)}; unmatched {extra!r:.400}"
    return f"{where}: got {got!r:.400}, expected {want!r:.400}"


def compare(expected: Exchange, actual: Exchange, label: str = "") -> list[str]:
    """Differences of `actual` (the emulator) from `expected` (the real server)."""
    want, got = shape(expected), shape(actual)
    diffs = []
    prefix = f"{label}: " if label else ""
    if want["status"] != got["status"]:
        diffs.append(f"{prefix}status {got['status']!r}, expected {want['status']!r}")
    if [n for n, _ in want["headers"]] != [n for n, _ in got["headers"]]:
        diffs.append(
            f"{prefix}header names {[n for n, _ in got['headers']]}, "
            f"expected {[n for n, _ in want['headers']]}"
        )
    else:
        for (name, w), (_, g) in zip(want["headers"], got["headers"], strict=True):
            if w != g:
                diffs.append(f"{prefix}header {name}: {g!r}, expected {w!r}")
    wbody, gbody = want["body"], got["body"]
    if wbody[0] == gbody[0] == "sse":
        (wframes, wcontent), (gframes, gcontent) = wbody[1], gbody[1]
        found = _first_difference(wframes, gframes, f"{prefix}frames")
        if found:
            diffs.append(found)
        if wcontent and gcontent:  # both sent plain token frames (neither merged them all)
            found = _first_difference(wcontent, gcontent, f"{prefix}token frames")
            if found:
                diffs.append(found)
        found = _sequence_difference(expected.body, actual.body, prefix)
        if found:
            diffs.append(found)
        return diffs
    found = _first_difference(wbody, gbody, f"{prefix}body")
    if found:
        diffs.append(found)
    return diffs


def first_line_port(line: str) -> int:
    match = re.search(r":(\d+)\s*$", line.strip())
    if not match:
        raise ValueError(f"no port in {line!r}")
    return int(match.group(1))


def wait_port(port: int, timeout: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def ends_by_eos_with_text(url: str, model: str, prompt: str, cut: int = 64) -> bool:
    """Greedy decoding of `prompt` on this server ends by EOS within `cut` tokens, with
    text, in both APIs the conformance cases ask it in (one chat template: the same tokens)."""
    asked = [
        ("/v1/responses", {"input": prompt, "max_output_tokens": cut}),
        ("/v1/messages", {"messages": [{"role": "user", "content": prompt}], "max_tokens": cut}),
    ]
    for path, fields in asked:
        answer = fetch(url, "POST", path, {"model": model, **fields, "temperature": 0})
        said = json.loads(answer.body)
        ended = said.get("status") == "completed" or said.get("stop_reason") == "end_turn"
        if not (ended and carries_text(answer)):
            return False
    return True


def first_ending_by_eos(url: str, model: str, prompts: Sequence[str]) -> str | None:
    """The first prompt whose greedy answer ends by EOS with text here (None: none does)."""
    return next((p for p in prompts if ends_by_eos_with_text(url, model, p)), None)
