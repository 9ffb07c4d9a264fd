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
  answers the probe sent (the smallest power of two at least twice the largest);
- a hold released by a timer: `coalescer` with that `window` (and a `size` no frame
  fills);
- an HTTP/1.0 upstream leg: `http10_upstream` (which also re-chunks toward the client);
- a read timeout after the head: `idle_reaper` with that `timeout`, ending as the
  client saw it (`close` for a truncated stream, `finish` for a proper end without
  `[DONE]`, `reset` when the upstream saw a reset);
- a client's leave the upstream learns late or never: `ignore_client_close`
  (`until: write_fails`, with a `cork` for a late first write; `until: never`);
- response headers added, changed or removed: `set_header` / `strip_header` on the
  response; request headers the same way on the request, except `Host` (a hop rewrites it
  to its upstream's address, which is not the scenario's) and the framing fields
  (`Connection`, `Content-Length`, `Transfer-Encoding`, `Keep-Alive`), which follow the
  framing.

What no fault expresses is a line that names the measurement showing it (`not_fitted`),
never dropped: an irregular hold, a whole answer sent with `Content-Length`, a chunked body
re-chunked without a hold or an HTTP/1.0 leg, a read timeout longer than the silence the
budget allowed.

`expected(path)` goes the other way for a preset: what the fingerprint of a path of
faults should say on the measures the mapping covers, so `closest_preset` compares a
fingerprint with each preset through the same rows.
"""

from __future__ import annotations

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
}
CALIBRATE_NAMES = {
    "hold_bytes": "median_burst",
    "hold_seconds": "largest_gap",
    "first_frame_wait": "first_byte",
    "idle_timeout": "first_byte",
    "leave_after": "abandon_latency",
    "leave_frames": "abandon_tokens",
}
# Header fields that follow the framing (RFC 9112 §6, §9.6), fitted by http10_upstream or
# the proxy's own relay, not by a header fault.
FRAMING_FIELDS = frozenset({"connection", "content-length", "transfer-encoding", "keep-alive"})
# A leave learned later than this, or with more frames written after it, is a hop that
# does not watch the client (nginx and Caddy learn within a few milliseconds).
LEAVE_PROMPT = 0.05
LEAVE_FRAMES = 2
# The fitted fields that are durations (a scenario writes them with a unit).
DURATIONS = frozenset({"timeout", "window", "cork"})
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
        if framing is not None and framing.get("client_framing") == "length":
            out.not_fitted.append(
                "framing: the client's answer came with Content-Length after a hold to the "
                "end; no fault re-frames a held answer with a length (proxy_buffering passes "
                "the upstream's framing)"
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
    if setting:
        out.add(
            "set_header",
            {"direction": direction, "headers": setting},
            f"{side}: added or changed {', '.join(setting)} (the values measured once: a "
            "hop that writes them per request, a Date or an id, writes other values)",
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
    late = gone["after"] > LEAVE_PROMPT
    if prompt_leave(gone):
        return
    config: dict[str, Any] = {"until": "write_fails"}
    if late:
        config["cork"] = round(gone["after"], 3)
    out.add(
        "ignore_client_close",
        config,
        f"leave: learned {gone['after']:.3f} s after the client's close, "
        f"{gone['frames_after_close']} frames written after",
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
    if framing:
        _fit_framing(framing, held_by, out)
    if held:
        _fit_hold(held, framing, out)
    if measures.get("leave"):
        _fit_leave(measures["leave"], out)
    if measures.get("idle"):
        _fit_idle(measures["idle"], out)
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
    idle = measures.get("idle")
    if idle:
        if idle["cut"]:
            found["idle_timeout"] = idle["timeout"]
            found["idle_end"] = idle["client_saw"]
        else:
            found["idle_timeout"] = f"at least {idle['at_least']}"
    gone = measures.get("leave")
    if gone:
        found["leave_learned"] = gone["learned"]
        if gone["learned"]:
            found["leave_after"] = gone["after"]
            found["leave_frames"] = gone["frames_after_close"]
            # what the fit reads as watched or not (`ignore_client_close` or none): a hop
            # that learns at a failed write (Apache: the second after the FIN, 20-40 ms at
            # the probe's 20 ms frames) is within leave_after's 50 ms of one that watches
            found["leave_prompt"] = prompt_leave(gone)
    return found


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
    timeout, whether a leave is learned and whether at once (no `ignore_client_close`).
    The hold shapes' answers bound a buffer: one larger than both is a hold to the end.
    `gzip_encoding` changes nothing here: it compresses only for a client that sends
    `Accept-Encoding: gzip`, which the fingerprint's requests do not (compression is not
    measured yet), so nginx-gzip reads as nginx-default, as the real nginx with `gzip on`
    does."""
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
        elif fault == "coalescer" and config.get("direction", "downstream") != "upstream":
            found["hold_by"] = "timer"
            found["hold_seconds"] = _seconds(config.get("window", 0.04))
            found["x_accel_buffering_honoured"] = False
        elif fault == "http10_upstream":
            found["upstream_version"] = "HTTP/1.0"
        elif fault == "idle_reaper":
            found["idle_timeout"] = _seconds(config.get("timeout", 60))
        elif fault == "ignore_client_close":
            found["leave_learned"] = config.get("until", "write_fails") != "never"
            if found["leave_learned"]:
                found["leave_prompt"] = False  # learned at a failed write, not watched
    found.setdefault("leave_learned", True)
    found.setdefault("leave_prompt", True)  # a hop without the fault watches the client
    if not found["leave_learned"]:
        found.pop("leave_prompt")
    found.setdefault("idle_timeout", NO_TIMEOUT)  # no read timeout: any silence passes
    if found["hold_by"] in ("nothing",):
        found.pop("x_accel_buffering_honoured", None)
    if found["hold_by"] == "end" and not any(f == "proxy_buffering" for f, _ in entries):
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
            return f"No preset agrees: each differs on at least {len(wrong)} measures."
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
