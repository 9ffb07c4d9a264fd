"""From a fingerprint to a scenario, and fingerprints compared measure by measure.

Pure: the fingerprint's measures (middlebox/scenario/fingerprint.py, the document's
`measures`) come in as plain data; out come a `path:` of middlebox's faults with their
parameters (`fit`), the YAML text of a scenario with that path (`scenario_text`), and
rows of agreement between two fingerprints (`agreement`), with the tolerances `make
calibrate` judges a preset by (calibrate/compare.py's TOLERANCES; a test holds the two
equal). The mapping, measure to fault (docs/fingerprint.md has it as a table):

- a hold released by a buffer size: `proxy_buffering` with that `buffer_size` (and
  `buffers_size`), `honour_x_accel_buffering` as measured; a buffer under nginx's
  `postpone_output` would be doubled by it, so the fitted hop postpones nothing then;
- a hold to the response's end: `proxy_buffering` with a buffer larger than the
  answers the probe sent (the smallest power of two at least twice the largest); when
  the client's answer came with a Content-Length from a chunked or close-delimited
  upstream answer, `buffer_whole_response` (which re-frames it with its length);
- a hold released by a timer: `coalescer` with that `window` (and a `size` no frame
  fills);
- an HTTP/1.0 upstream leg: `http10_upstream` (which also re-chunks toward the client);
- a read timeout after the head: `idle_reaper` with that `timeout`, ending as the
  client saw it (`close` for a truncated stream, `finish` for a proper end without
  `[DONE]`, `reset` when the upstream saw a reset);
- a client's leave the upstream learns late or never: `ignore_client_close`
  (`until: write_fails`, with no `cork` when it was learned within WRITES_AFTER writes
  after the close, a failed write's, and with the delay as `cork` when later; `until:
  never`);
- compression asked for: `gzip_encoding` (`flush: sync` when every frame was decodable
  as written, `none` when held; `require_accept_encoding: false` when it compresses
  unasked);
- SSE fields: `sse_retry` (`strip`, or `change` to the value that arrived), `sse_ids`
  (`strip`, or `renumber` from the first id that arrived), and a `Last-Event-ID` removed or
  changed as a request header fault;
- a timeout before the head: the `before_headers` of the idle_reaper fitted for the
  silence after it (504, 502, reset), or an idle_reaper of its own;
- a duration cap: `max_duration` with that `limit` and end; a silence or a wait for the
  head cut at the cap's time is the cap's, not a read timeout's;
- response headers added, changed or removed: `set_header` / `strip_header` on the
  response (with the first request's values; those that changed on a second request are a
  line of what no fault expresses); request headers the same way on the request, except
  `Host` (a hop rewrites it to its upstream's address, which is not the scenario's) and
  the framing fields (`Connection`, `Content-Length`, `Transfer-Encoding`, `Keep-Alive`),
  which follow the framing.

What no fault expresses is a line that names the measurement showing it (`not_fitted`),
never dropped: an irregular hold, header values that change per request, a chunked body
re-chunked without a hold or an HTTP/1.0 leg, a read timeout longer than the silence the
budget allowed, heartbeats eaten, a coding other than gzip, a client's reset passed
otherwise than its FIN, timeouts that differ before and after the head.

`expected(path)` goes the other way for a preset: what the fingerprint of a path of
faults should say on the measures the mapping covers, so `closest_preset` compares a
fingerprint with each preset through the same rows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from middlebox.scenario.fingerprint import HOLD_B
from middlebox.scenario.units import format_duration, parse_duration, parse_size

# calibrate/compare.py's TOLERANCES for the same quantities (|a - b| <= max(absolute,
# relative * |a|)): a burst's bytes as its median_burst, a timer as its largest_gap, a
# first frame's wait and a read timeout as its first_byte, a leave as its abandon_latency
# and abandon_tokens.
TOLERANCES: dict[str, tuple[float, float, str]] = {
    "hold_bytes": (256, 0.20, "B"),
    "hold_seconds": (0.05, 0.25, "s"),
    "first_frame_wait": (0.05, 0.20, "s"),
    "idle_timeout": (0.05, 0.20, "s"),
    "leave_after": (0.05, 0.25, "s"),
    "leave_frames": (3, 0.25, ""),
    "rst_after": (0.05, 0.25, "s"),
    "head_timeout": (0.05, 0.20, "s"),
    "duration_cap": (0.05, 0.20, "s"),
    "rst_frames": (3, 0.25, ""),
}
CALIBRATE_NAMES = {
    "hold_bytes": "median_burst",
    "hold_seconds": "largest_gap",
    "first_frame_wait": "first_byte",
    "idle_timeout": "first_byte",
    "leave_after": "abandon_latency",
    "leave_frames": "abandon_tokens",
    "rst_after": "abandon_latency",
    "head_timeout": "first_byte",
    "duration_cap": "first_byte",
    "rst_frames": "abandon_tokens",
}
# Header fields that follow the framing (RFC 9112 §6, §9.6), fitted by http10_upstream or
# the proxy's own relay, not by a header fault.
FRAMING_FIELDS = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})
# A leave learned later than this, or with more frames written after it, is a hop that
# does not watch the client (nginx and Caddy learn within a few milliseconds).
LEAVE_PROMPT = 0.05
LEAVE_FRAMES = 2
# A leave learned within this many writes after the client's close is a failed write's
# (the first write after a FIN draws the client's RST, RFC 9293 §3.10.7.1, and the second
# or third fails: Apache 2, Varnish 2-3 at 20 and 100 ms frames), fitted with no `cork`, so
# it plays back at every frame period; a later one is a time (HAProxy's MSG_MORE cork:
# 0.22 s, 11-12 frames at 20 ms), fitted as `cork`. One frame period cannot tell the two
# apart within this many writes.
WRITES_AFTER = 3
# The fitted fields that are durations (a scenario writes them with a unit).
DURATIONS = frozenset({"timeout", "window", "cork", "delay", "limit"})
# How the client saw an end, as the `before_headers` (a status page, a reset) and `end`
# (a cut stream) of idle_reaper and max_duration write it.
BEFORE_HEADERS = {"status 504": "504", "status 502": "502", "reset": "reset"}
CAP_ENDS = {"truncated": "truncated_chunked", "complete-without-done": "fin", "reset": "rst"}
# What a path without a read timeout reads as: every silence passes.
NO_TIMEOUT = "at least inf"
# A hold whose bytes no frame of the probe fills: the timer releases it, not the size.
TIMER_SIZE = 1 << 20


@dataclass
class Fitted:
    """A fitted path (entries `{fault: {field: value}}`, client side first), why each
    entry is there, and the lines for what no fault expresses."""

    path: list[dict[str, dict[str, Any]]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    not_fitted: list[str] = field(default_factory=list)

    def add(self, fault: str, config: Mapping[str, Any], reason: str) -> None:
        self.path.append({fault: dict(config)})
        self.reasons.append(reason)

    def config(self, fault: str) -> dict[str, Any] | None:
        """The first entry's config for `fault`, or None."""
        for entry in self.path:
            if fault in entry:
                return entry[fault]
        return None


def _pow2_at_least(value: float) -> int:
    return 1 << max(math.ceil(math.log2(max(value, 1.0))), 0)


def reframed(framing: Mapping[str, Any]) -> bool:
    """Whether a chunked or close-delimited answer reached the client with a length."""
    return framing.get("client_framing") == "length" and framing.get("upstream_framing") in (
        "chunked",
        "close",
    )


def _fit_hold(held: Mapping[str, Any], framing: Mapping[str, Any] | None, out: Fitted) -> None:
    by = held["release"]
    accel = held.get("x_accel_buffering_honoured")
    honour = accel is not False
    if by["by"] == "size":
        size = max(round(by["bytes"]), 1)
        config: dict[str, Any] = {"buffer_size": size, "buffers_size": size}
        if size < 1460:
            config["postpone_output"] = 0  # nginx's 1460 would hold two buffers as one burst
        if not honour:
            config["honour_x_accel_buffering"] = False
        out.add(
            "proxy_buffering",
            config,
            f"hold: bursts of {size} ± {by['uncertainty']:.0f} B, released by a buffer size",
        )
    elif by["by"] == "end" and framing is not None and reframed(framing):
        # lighttpd's default: the whole answer, re-framed with its length (a chunked
        # upstream leg, or a close-delimited one, reaches the client with Content-Length)
        out.add(
            "buffer_whole_response",
            {"honour_x_accel_buffering": True} if accel else {},
            f"hold: the whole answer (at least {by['at_least_bytes']} B) until its end, "
            f"sent with Content-Length (the upstream's was {framing.get('upstream_framing')})",
        )
    elif by["by"] == "end":
        size = _pow2_at_least(2 * by["at_least_bytes"])
        config = {"buffer_size": size, "buffers_size": size}
        if not honour:
            config["honour_x_accel_buffering"] = False
        out.add(
            "proxy_buffering",
            config,
            f"hold: the whole answer (at least {by['at_least_bytes']} B) until its end",
        )
    elif by["by"] == "timer":
        config = {"direction": "downstream", "window": round(by["seconds"], 3),
                  "size": TIMER_SIZE}  # fmt: skip
        out.add(
            "coalescer",
            config,
            f"hold: released every {by['seconds']:.3f} ± {by['uncertainty']:.3f} s by a timer",
        )
        if accel:
            out.not_fitted.append(
                "hold: X-Accel-Buffering: no turned a timer's hold off; coalescer does not "
                "read that header, so the fitted path holds those answers too"
            )
    elif by["by"] == "irregular":
        out.not_fitted.append(
            "hold: bursts that agree neither in bytes nor in time across the two shapes "
            "(neither a buffer size nor a timer); no fault was fitted for them"
        )
    elif by["held"] is None:
        out.not_fitted.append(f"hold: not measured ({by['by']})")


def _fit_framing(framing: Mapping[str, Any], held_by: str, out: Fitted) -> bool:
    """http10_upstream for an HTTP/1.0 upstream leg; True when it was fitted."""
    if framing.get("upstream_version") == "HTTP/1.0":
        out.add(
            "http10_upstream",
            {},
            "framing: the upstream leg is HTTP/1.0 "
            f"({framing.get('upstream_framing')}), re-chunked toward the client",
        )
        return True
    chunked = framing.get("client_framing") == "chunked"
    if framing.get("rechunked") and chunked and held_by == "nothing":
        out.not_fitted.append(
            f"framing: the client got {framing.get('client_chunks')} chunks for the "
            f"probe's {framing.get('upstream_chunks')} without a hold; no fault re-chunks a "
            "chunked body (an SSE client reads across chunks, so its events are the same)"
        )
    return False


def _header_faults(
    changes: Mapping[str, Sequence[Sequence[str]]], direction: str, out: Fitted
) -> None:
    side = "request_headers" if direction == "request" else "response_headers"
    setting: dict[str, str] = {}
    removed: list[str] = []
    for name, value in changes.get("added", []):
        if name.lower() not in FRAMING_FIELDS:
            setting[name] = value
    for name, _sent, value in changes.get("changed", []):
        if name.lower() == "host":
            out.not_fitted.append(
                f"{side}: Host rewritten to {value} (the path's upstream address); not "
                "fitted: a scenario's upstream has its own"
            )
        elif name.lower() not in FRAMING_FIELDS:
            setting[name] = value
    for name, _value in changes.get("removed", []):
        if name.lower() not in FRAMING_FIELDS:
            removed.append(name)
    if removed:
        config: dict[str, Any] = {"headers": removed}
        if direction == "request":
            config["direction"] = "request"
        out.add("strip_header", config, f"{side}: removed {', '.join(removed)}")
    if not setting:
        return
    varying = [row for row in changes.get("varying", []) if row[0] in setting]
    if "varying" not in changes:
        values = ("the values measured once: a hop that writes them per request, a Date or "
                  "an id, writes other values")  # fmt: skip
    elif varying:
        values = f"the first request's values; {', '.join(r[0] for r in varying)} changed"
    else:
        values = "the same on two requests"
    out.add(
        "set_header",
        {"direction": direction, "headers": setting},
        f"{side}: added or changed {', '.join(setting)} ({values})",
    )
    if varying:
        seen = "; ".join(f"{n}: {a} then {b or '(absent)'}" for n, a, b in varying)
        out.not_fitted.append(
            f"{side}: values that change per request ({seen}); set_header writes the first "
            "on every one"
        )


def _fit_cap(cap: Mapping[str, Any], head: Mapping[str, Any] | None, out: Fitted) -> None:
    """max_duration for a busy stream cut at a time; the wait for the head is cut by it
    too when the head's timeout is the cap's (its answer is then the cap's)."""
    if not cap["cut"]:
        return
    config: dict[str, Any] = {"limit": cap["limit"]}
    end = CAP_ENDS.get(cap["client_saw"])
    if end is None:
        out.not_fitted.append(
            f"duration_cap: the client saw a {cap['client_saw']} answer when the stream was "
            "cut; max_duration fitted ending it as a truncated stream"
        )
    elif end != "truncated_chunked":
        config["end"] = end
    if head is not None and head["cut"] and _within("duration_cap", cap["limit"], head["timeout"]):
        before = BEFORE_HEADERS.get(head["end"])
        if before is None:
            out.not_fitted.append(
                f"head_idle: the cap ended a request without a head with {head['end']}; "
                "max_duration answers 504, 502 or a reset"
            )
        elif before != "504":
            config["before_headers"] = before
    out.add(
        "max_duration",
        config,
        f"duration_cap: a steady stream cut {cap['limit']:.2f} ± {cap['uncertainty']:.2f} s "
        f"after the request, the client saw a {cap['client_saw']} answer",
    )


def _by_cap(cap: Mapping[str, Any] | None, at: float) -> bool:
    """Whether an end `at` seconds after the request is the duration cap's."""
    return bool(cap and cap["cut"] and _within("duration_cap", cap["limit"], at))


def _fit_head(head: Mapping[str, Any], idle: Mapping[str, Any] | None, out: Fitted) -> None:
    """The timeout before the head, on the idle_reaper fitted for the silence after it (one
    timeout for both, as nginx's proxy_read_timeout), or said when they differ."""
    reaper = out.config("idle_reaper")
    if not head["cut"]:
        if reaper is not None and head["at_least"] > reaper["timeout"] * 1.2 + 0.05:
            out.not_fitted.append(
                f"head_idle: a head {head['at_least']:.1f} s late passed, but a silence after "
                f"the head was cut at {reaper['timeout']:.2f} s; idle_reaper times both the same"
            )
        return
    before = BEFORE_HEADERS.get(head["end"])
    if before is None:
        out.not_fitted.append(
            f"head_idle: a request without a head ended with {head['end']} after "
            f"{head['timeout']:.2f} s; idle_reaper answers 504, 502 or a reset"
        )
    if reaper is None:
        if idle is not None and not idle["cut"] and idle["at_least"] >= head["timeout"]:
            out.not_fitted.append(
                f"head_idle: a request without a head ended after {head['timeout']:.2f} s, "
                f"but a silence of {idle['at_least']:.1f} s after the head passed; no fault "
                "times out only before the head"
            )
            return
        config: dict[str, Any] = {"timeout": head["timeout"]}
        if before not in (None, "504"):
            config["before_headers"] = before
        out.add("idle_reaper", config,
                f"head_idle: no head after {head['timeout']:.2f} s: {head['end']}")  # fmt: skip
        return
    if before not in (None, "504"):
        reaper["before_headers"] = before
    if not _within("head_timeout", head["timeout"], reaper["timeout"]):
        out.not_fitted.append(
            f"head_idle: the timeout before the head is {head['timeout']:.2f} s, after it "
            f"{reaper['timeout']:.2f} s; idle_reaper has one timeout for both (fitted: after)"
        )


def _fit_idle(idle: Mapping[str, Any], out: Fitted) -> None:
    if not idle["cut"]:
        out.not_fitted.append(
            f"idle: no read timeout within the {idle['at_least']:.1f} s silence the budget "
            "allowed; none fitted (a longer timeout, or none, looks the same: run with a "
            "larger --budget to see it)"
        )
        return
    if idle["how"] == "rst":
        after = "reset"
    elif idle["client_saw"] == "complete-without-done":
        after = "finish"
    else:
        after = "close"
    saw = str(idle["client_saw"])
    if saw.startswith("status") or saw == "complete":
        out.not_fitted.append(
            f"idle: the hop closed its upstream after {idle['timeout']:.2f} s of silence but "
            f"the client saw a {saw} answer; idle_reaper fitted as a close"
        )
    out.add(
        "idle_reaper",
        {"timeout": round(idle["timeout"], 3), "after_headers": after},
        f"idle: the upstream connection closed after {idle['timeout']:.2f} s of silence "
        f"({idle['how']}), the client saw a {saw} answer",
    )


def prompt_leave(gone: Mapping[str, Any]) -> bool:
    """Whether a learned leave is a hop's watching the client (learned within
    LEAVE_PROMPT, fewer than LEAVE_FRAMES frames after), not a failed write's."""
    return bool(gone["after"] <= LEAVE_PROMPT and gone["frames_after_close"] < LEAVE_FRAMES)


def _fit_leave(gone: Mapping[str, Any], out: Fitted) -> None:
    if not gone["learned"]:
        out.add(
            "ignore_client_close",
            {"until": "never"},
            f"leave: the upstream did not learn of the client's leave within "
            f"{gone['at_least']:.1f} s",
        )
        return
    if prompt_leave(gone):
        return
    config: dict[str, Any] = {"until": "write_fails"}
    counted = gone["frames_after_close"] <= WRITES_AFTER
    if gone["after"] > LEAVE_PROMPT and not counted:
        config["cork"] = round(gone["after"], 3)
    how = "a failed write, counted in writes" if counted else "a time after the first write"
    out.add(
        "ignore_client_close",
        config,
        f"leave: learned {gone['after']:.3f} s after the client's close, "
        f"{gone['frames_after_close']} frames written after ({how})",
    )


def _fit_compression(found: Mapping[str, Any], out: Fitted) -> None:
    if not found["compresses"]:
        return
    asked, unasked = found["asked"], found["unasked"]
    if asked != "gzip" or (unasked is not None and unasked != "gzip"):
        out.not_fitted.append(
            f"compression: the path encodes the stream as {asked or unasked} (asked with "
            f"Accept-Encoding: gzip: {asked or 'identity'}; not asked: {unasked or 'identity'})"
            "; gzip_encoding writes gzip only, for a client that accepts it or for any"
        )
        return
    config: dict[str, Any] = {"flush": "sync" if found.get("flush") == "per-frame" else "none"}
    if unasked is not None:
        config["require_accept_encoding"] = False
    if found.get("flush") == "unknown":
        out.not_fitted.append(
            "compression: the gzip body did not decode whole, so its flush is unknown; "
            "gzip_encoding fitted holding it (flush: none)"
        )
    how = "every frame flushed" if config["flush"] == "sync" else "the compressed bytes held"
    asks = "" if unasked is None else ", even for a client that does not ask"
    out.add("gzip_encoding", config, f"compression: gzip{asks}, {how}")


def _fit_sse(found: Mapping[str, Any], out: Fitted) -> None:
    header = found["last_event_id"]
    if found["decoded"]:
        beats = found["heartbeats"]
        if beats["verdict"] != "passed":
            out.not_fitted.append(
                f"sse_fields: {beats['arrived']} of {beats['sent']} `: keep-alive` comments "
                "arrived; no fault drops SSE comments"
            )
        retry = found["retry"]
        values = set(retry["arrived"])
        if retry["verdict"] == "removed":
            out.add("sse_retry", {"mode": "strip"}, "sse_fields: retry: lines removed")
        elif retry["verdict"] == "changed" and len(values) == 1 and values.pop().isdigit():
            delay = int(retry["arrived"][0]) / 1000
            said = f"sse_fields: retry: {retry['sent'][0]} arrived as {retry['arrived'][0]}"
            out.add("sse_retry", {"mode": "change", "delay": delay}, said)
        elif retry["verdict"] == "changed":
            out.not_fitted.append(
                f"sse_fields: retry: lines {retry['sent']} arrived as {retry['arrived']}; "
                "sse_retry sets one value in one line"
            )
        ids = found["id"]
        numbers = [int(v) for v in ids["arrived"] if v.isdigit()]
        steps = len(numbers) == len(ids["arrived"]) and all(
            b - a == 1 for a, b in itertools.pairwise(numbers)
        )
        if ids["verdict"] == "removed":
            out.add("sse_ids", {"mode": "strip"}, "sse_fields: id: lines removed")
        elif ids["verdict"] == "changed" and numbers and steps:
            out.add("sse_ids", {"mode": "renumber", "start": numbers[0]},
                    f"sse_fields: id: lines renumbered from {numbers[0]}")  # fmt: skip
        elif ids["verdict"] == "changed":
            out.not_fitted.append(
                f"sse_fields: id: lines {ids['sent']} arrived as {ids['arrived']}; sse_ids "
                "numbers them in steps of one"
            )
    if header["verdict"] == "removed":
        out.add("strip_header", {"headers": ["Last-Event-ID"], "direction": "request"},
                "sse_fields: the Last-Event-ID request header removed")  # fmt: skip
    elif header["verdict"] == "changed":
        said = f"sse_fields: Last-Event-ID {header['sent']} arrived as {header['arrived']}"
        config = {"direction": "request", "headers": {"Last-Event-ID": header["arrived"]}}
        out.add("set_header", config, said)


def _fit_reset(reset: Mapping[str, Any], fin: Mapping[str, Any] | None, out: Fitted) -> None:
    """A client's RST: fitted from it alone when the FIN was not measured; said when it
    disagrees with what the fault fitted for the FIN does with a reset
    (ignore_client_close fails the next write after one, or ignores it with `never`)."""
    if fin is None:
        _fit_leave(reset, out)
        return
    fin_prompt = fin["learned"] and fin["after"] <= LEAVE_PROMPT
    fin_prompt = fin_prompt and fin["frames_after_close"] < LEAVE_FRAMES
    rst_prompt = reset["learned"] and reset["after"] <= LEAVE_PROMPT
    rst_prompt = rst_prompt and reset["frames_after_close"] < LEAVE_FRAMES
    if fin_prompt and not rst_prompt:
        said = (
            f"{reset['after']:.3f} s later, {reset['frames_after_close']} frames written after"
            if reset["learned"]
            else f"not within {reset['at_least']:.1f} s"
        )
        out.not_fitted.append(
            f"leave_rst: a client's FIN reaches the upstream at once but its reset {said}; "
            "no fault passes a FIN and holds a reset"
        )
    elif not fin["learned"] and reset["learned"]:
        out.not_fitted.append(
            f"leave_rst: a client's FIN never reaches the upstream but its reset does, "
            f"{reset['after']:.3f} s later; ignore_client_close until: never ignores both"
        )


def fit(measures: Mapping[str, Any]) -> Fitted:
    """The path of faults that behaves like the measured one, client side first (as a
    proxy stacks them: the hop's response header changes, its framing, its buffer, its
    leave, then its read timeout, which counts upstream reads), and what no fault
    expresses. The leave sits upstream of the hold, as in haproxy-default: its `cork` is
    the whole delay measured from the probe's first write after the client's close, so
    the fault must see the probe's writes; client side of a timer's hold it would see
    only the hold's releases, and learn a release or two later (a 0.23 s leave behind a
    0.22 s timer plays back as 0.48 s there)."""
    out = Fitted()
    held = measures.get("hold")
    framing = measures.get("framing")
    held_by = held["release"]["by"] if held else "unknown"
    if measures.get("response_headers"):
        _header_faults(measures["response_headers"], "response", out)
    if measures.get("request_headers"):
        _header_faults(measures["request_headers"], "request", out)
    if measures.get("compression"):
        _fit_compression(measures["compression"], out)
    if measures.get("sse_fields"):
        _fit_sse(measures["sse_fields"], out)
    if framing:
        _fit_framing(framing, held_by, out)
    if held:
        _fit_hold(held, framing, out)
    if measures.get("leave"):
        _fit_leave(measures["leave"], out)
    if measures.get("leave_rst"):
        _fit_reset(measures["leave_rst"], measures.get("leave"), out)
    cap, head, idle = (measures.get(key) for key in ("duration_cap", "head_idle", "idle"))
    if idle and not (idle["cut"] and _by_cap(cap, idle.get("cut_at", -1.0))):
        _fit_idle(idle, out)
    if head and not (head["cut"] and _by_cap(cap, head["timeout"])):
        _fit_head(head, idle, out)
    if cap:
        _fit_cap(cap, head, out)
    return out


def scenario_text(fitted: Fitted, *, name: str, url: str) -> str:
    """A scenario with the fitted path, each fault under a comment saying which measure
    put it there, and the measures no fault expresses as comments at the end."""
    lines = [
        f"name: {name}",
        "description: >-",
        f"  The path in front of the probe upstream at {url}, fitted by `middlebox "
        "fingerprint --write`",
        "  (docs/fingerprint.md); `middlebox fingerprint URL --verify` plays it back.",
        "path:" if fitted.path else "path: []",
    ]
    for entry, reason in zip(fitted.path, fitted.reasons, strict=True):
        fault, config = next(iter(entry.items()))
        config = {k: format_duration(v) if k in DURATIONS else v for k, v in config.items()}
        flow = yaml.safe_dump(config, default_flow_style=True, width=10_000).strip()
        lines += [f"  # {reason}", f"  - {fault}: {flow}"]
    if fitted.not_fitted:
        lines.append("# Not expressed by any fault:")
        lines += [f"#   {line}" for line in fitted.not_fitted]
    return "\n".join(lines) + "\n"


# -- fingerprints as comparable values ----------------------------------------------------------


def values(measures: Mapping[str, Any]) -> dict[str, Any]:
    """The measures a scenario can reproduce, flat: exact ones (kinds, versions, flags)
    and numbers with a tolerance (TOLERANCES); "at least" readings keep that prefix."""
    found: dict[str, Any] = {}
    held = measures.get("hold")
    if held:
        by = held["release"]
        found["hold_by"] = by["by"]
        if by["by"] == "size":
            found["hold_bytes"] = by["bytes"]
        elif by["by"] == "timer":
            found["hold_seconds"] = by["seconds"]
        shapes = held.get("shapes") or []
        if shapes and shapes[0].get("first_frame_wait") is not None:
            found["first_frame_wait"] = shapes[0]["first_frame_wait"]
        if "x_accel_buffering_honoured" in held:
            found["x_accel_buffering_honoured"] = held["x_accel_buffering_honoured"]
    framing = measures.get("framing")
    if framing:
        found["upstream_version"] = framing["upstream_version"]
        found["client_framing"] = framing["client_framing"]
    for side in ("request_headers", "response_headers"):
        changes = measures.get(side)
        if changes is not None:
            # Host and the framing fields are not fitted (`fit`): the framing rows and the
            # lines for what is not fitted cover them
            names = [f"+{n}" for n, _ in changes["added"]]
            names += [f"-{n}" for n, _ in changes["removed"]]
            names += [f"~{n}" for n, *_ in changes["changed"]]
            found[side] = sorted(
                n.lower() for n in names if n[1:].lower() not in FRAMING_FIELDS | {"host"}
            )
    # (measure, its row, the ending's row, the time's field, the ending's field)
    timed = (
        ("head_idle", "head_timeout", "head_end", "timeout", "end"),
        ("duration_cap", "duration_cap", "cap_end", "limit", "client_saw"),
        ("idle", "idle_timeout", "idle_end", "timeout", "client_saw"),
    )
    for key, row, end_row, at, end in timed:
        cut = measures.get(key)
        if not cut:
            continue
        if cut["cut"]:
            found[row], found[end_row] = cut[at], cut[end]
        else:
            found[row] = f"at least {cut['at_least']}"
    for key, prefix in (("leave", "leave"), ("leave_rst", "rst")):
        gone = measures.get(key)
        if gone:
            found[f"{prefix}_learned"] = gone["learned"]
            if gone["learned"]:
                found[f"{prefix}_after"] = gone["after"]
                found[f"{prefix}_frames"] = gone["frames_after_close"]
            if gone["learned"] and key == "leave":
                # what the fit reads as watched or not (`ignore_client_close` or none): a hop
                # that learns at a failed write (Apache: the second after the FIN, 20-40 ms
                # at the probe's 20 ms frames) is within leave_after's 50 ms of one that
                # watches
                found["leave_prompt"] = prompt_leave(gone)
    squeezed = measures.get("compression")
    if squeezed:
        found["compression"] = compression_value(squeezed)
        found["compresses_unasked"] = squeezed["unasked"] is not None
    fields = measures.get("sse_fields")
    if fields:
        if fields["decoded"]:
            found["heartbeats"] = fields["heartbeats"]["verdict"]
            found["retry_lines"] = fields["retry"]["verdict"]
            found["id_lines"] = fields["id"]["verdict"]
        found["last_event_id"] = fields["last_event_id"]["verdict"]
    return found


def compression_value(found: Mapping[str, Any]) -> str:
    """The compression measure as one comparable value: `none`, or the coding and how its
    bytes flow (`gzip, per-frame`, `gzip, held`)."""
    if found["asked"] is None:
        return "none"
    return f"{found['asked']}, {found.get('flush', 'unknown')}"


@dataclass(frozen=True)
class Row:
    """One measure in both fingerprints: the path's value, the model's, the tolerance."""

    measure: str
    path: Any
    model: Any
    tolerance: str
    ok: bool


def _at_least(value: Any) -> float | None:
    if isinstance(value, str) and value.startswith("at least "):
        return float(value.removeprefix("at least "))
    return None


def _within(measure: str, a: float, b: float) -> bool:
    absolute, relative, _ = TOLERANCES[measure]
    return abs(a - b) <= max(absolute, relative * abs(a))


def _agrees(measure: str, a: Any, b: Any) -> bool:
    if measure not in TOLERANCES:
        return bool(a == b)
    low_a, low_b = _at_least(a), _at_least(b)
    if low_a is not None and low_b is not None:
        return True  # both outlasted their silences: nothing tells them apart
    if low_a is not None:  # the path outlasted low_a: the model's timeout must too
        return float(b) >= low_a or _within(measure, low_a, float(b))
    if low_b is not None:
        return float(a) >= low_b or _within(measure, float(a), low_b)
    return _within(measure, float(a), float(b))


def _tolerance(measure: str) -> str:
    if measure not in TOLERANCES:
        return "identical"
    absolute, relative, unit = TOLERANCES[measure]
    return f"±{absolute:g}{unit} or ±{relative:.0%}"


def agreement(path: Mapping[str, Any], model: Mapping[str, Any]) -> list[Row]:
    """A row per measure both `values` have (the path's first, as calibrate compares a
    real proxy with its preset)."""
    rows = []
    for measure, value in path.items():
        if measure in model:
            other = model[measure]
            rows.append(Row(measure, value, other, _tolerance(measure),
                            _agrees(measure, value, other)))  # fmt: skip
    return rows


def agreement_lines(rows: Sequence[Row]) -> list[str]:
    """The rows as a table a person reads (columns as wide as their values), then the
    count that agrees."""
    table = [("measure", "path", "scenario", "tolerance", "")]
    table += [(row.measure, _shown(row.path), _shown(row.model), row.tolerance,
               "agrees" if row.ok else "DIFFERS") for row in rows]  # fmt: skip
    widths = [max(len(line[k]) for line in table) for k in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=False))
             + "  " + line[4] for line in table]  # fmt: skip
    lines = [line.rstrip() for line in lines]
    agreed = sum(row.ok for row in rows)
    lines.append(f"{agreed} of {len(rows)} measures agree.")
    return lines


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, list):
        return ",".join(value) or "-"
    return str(value)


# -- presets: what their fingerprint should say -----------------------------------------------


def _entries(text: str) -> list[tuple[str, dict[str, Any]]]:
    """A preset's path (the list, or the mapping with `path:`) as (fault, config) pairs."""
    document = yaml.safe_load(text) or []
    path = document.get("path", []) if isinstance(document, dict) else document
    return [(name, dict(config or {})) for entry in path for name, config in entry.items()]


def _seconds(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else parse_duration(str(value))


def _bytes(value: Any) -> int:
    return int(value) if isinstance(value, int) else parse_size(str(value))


def expected(text: str) -> dict[str, Any]:
    """What a fingerprint of the path in `text` (a preset's YAML) says, on the measures
    the fitter maps: the hold, X-Accel-Buffering, the upstream's HTTP version, the read
    timeout, whether a leave (FIN or RST) is learned and whether at once (no
    `ignore_client_close`), compression and the SSE fields. The
    hold shapes' answers bound a buffer: one larger than both is a hold to the end.
    `gzip_encoding` compresses only for a client that sends `Accept-Encoding: gzip`, which
    only the compression measure's request does, so nginx-gzip differs from nginx-default
    there alone, as the real nginx with `gzip on` does. SSE fields no fault touches are
    expected to pass; `Last-Event-ID` is left out (a preset's header faults are not read
    here)."""
    found: dict[str, Any] = {"hold_by": "nothing", "upstream_version": "HTTP/1.1"}
    answers = HOLD_B.frames * (HOLD_B.size or 0)
    entries = _entries(text)
    for fault, config in entries:
        if fault == "proxy_buffering":
            size = _bytes(config.get("buffer_size", 4096))
            postpone = _bytes(config.get("postpone_output", 1460))
            released = size * max(math.ceil(postpone / size), 1)
            found["hold_by"] = "end" if released >= answers else "size"
            if released < answers:
                found["hold_bytes"] = released
            found["x_accel_buffering_honoured"] = bool(config.get("honour_x_accel_buffering", True))
        elif fault == "buffer_whole_response":
            found["hold_by"] = "end"
            found["x_accel_buffering_honoured"] = bool(
                config.get("honour_x_accel_buffering", False)
            )
        elif fault == "coalescer" and config.get("direction", "downstream") != "upstream":
            found["hold_by"] = "timer"
            found["hold_seconds"] = _seconds(config.get("window", 0.04))
            found["x_accel_buffering_honoured"] = False
        elif fault == "http10_upstream":
            found["upstream_version"] = "HTTP/1.0"
        elif fault == "idle_reaper":
            found["idle_timeout"] = _seconds(config.get("timeout", 60))
            found["head_timeout"] = found["idle_timeout"]
            before = str(config.get("before_headers", "504"))
            found["head_end"] = "reset" if before == "reset" else f"status {before}"
        elif fault == "max_duration":
            found["duration_cap"] = _seconds(config.get("limit", 30))
            found["cap_before"] = str(config.get("before_headers", "504"))
        elif fault == "ignore_client_close":
            found["leave_learned"] = config.get("until", "write_fails") != "never"
            found["rst_learned"] = found["leave_learned"]
            if found["leave_learned"]:
                found["leave_prompt"] = False  # learned at a failed write, not watched
        elif fault == "gzip_encoding":
            flush = "per-frame" if config.get("flush", "none") == "sync" else "held"
            found["compression"] = f"gzip, {flush}"
            found["compresses_unasked"] = not config.get("require_accept_encoding", True)
        elif fault == "sse_retry":
            found["retry_lines"] = {"strip": "removed", "change": "changed"}.get(
                config.get("mode", "set"), "changed"
            )
        elif fault == "sse_ids":
            found["id_lines"] = {"strip": "removed"}.get(config.get("mode", "add"), "changed")
    cap, head = found.get("duration_cap"), found.get("head_timeout")
    if cap is not None and (head is None or cap < head):
        found["head_timeout"] = cap  # the cap ends a wait for the head too
        before = found["cap_before"]
        found["head_end"] = "reset" if before == "reset" else f"status {before}"
    found.pop("cap_before", None)
    if found.get("compression") == "gzip, per-frame" and found["hold_by"] != "nothing":
        found["compression"] = "gzip, held"  # a hold beside the compressor holds its frames
    for name, value in (("head_timeout", NO_TIMEOUT), ("duration_cap", NO_TIMEOUT),
                        ("leave_learned", True), ("rst_learned", True), ("compression", "none"),
                        ("compresses_unasked", False), ("heartbeats", "passed"),
                        ("retry_lines", "passed"), ("id_lines", "passed")):  # fmt: skip
        found.setdefault(name, value)
    found.setdefault("leave_prompt", True)  # a hop without the fault watches the client
    if not found["leave_learned"]:
        found.pop("leave_prompt")
    found.setdefault("idle_timeout", NO_TIMEOUT)  # no read timeout: any silence passes
    if found["hold_by"] in ("nothing",):
        found.pop("x_accel_buffering_honoured", None)
    holds = ("proxy_buffering", "buffer_whole_response")
    if found["hold_by"] == "end" and not any(f in holds for f, _ in entries):
        found.pop("x_accel_buffering_honoured", None)
    return found


@dataclass(frozen=True)
class Closest:
    """The presets with the fewest disagreeing rows (`names`, several when they tie), their
    rows, and whether they agree on every row."""

    names: tuple[str, ...]
    rows: tuple[Row, ...]
    agrees: bool

    def line(self) -> str:
        if not self.names:
            return "Closest preset: none to compare."
        said = " and ".join(self.names)
        tie = " (indistinguishable on these measures)" if len(self.names) > 1 else ""
        if self.agrees:
            return f"Closest preset: {said}{tie}, agreeing on all {len(self.rows)} measures."
        wrong = [row.measure for row in self.rows if not row.ok]
        if len(self.names) > 2:
            plural = "" if len(wrong) == 1 else "s"
            return f"No preset agrees: each differs on at least {len(wrong)} measure{plural}."
        return f"No preset agrees; the nearest, {said}{tie}, differs on {', '.join(wrong)}."


def closest_preset(measures: Mapping[str, Any], presets: Mapping[str, str]) -> Closest:
    """The preset (name to its YAML, as faults/presets.py holds them) whose expected
    fingerprint disagrees with `measures` on the fewest rows (then agrees on the most);
    named as agreeing only when every row agrees within the tolerances."""
    found = values(measures)
    ranked: list[tuple[tuple[int, int], str, list[Row]]] = []
    for name, text in presets.items():
        rows = agreement(found, expected(text))
        # fewer disagreements first; then more agreements (more of the preset matched)
        score = (sum(not row.ok for row in rows), -sum(row.ok for row in rows))
        ranked.append((score, name, rows))
    if not ranked:
        return Closest((), (), False)
    best_score = min(score for score, _, _ in ranked)
    best = [(name, rows) for score, name, rows in ranked if score == best_score]
    return Closest(tuple(name for name, _ in best), tuple(best[0][1]), best_score[0] == 0)
