"""What a path does to a real LLM server's token stream: the measures that need no probe.

When the probe upstream cannot stand behind the path, `middlebox fingerprint` streams a
few real chat completions through it (middlebox/tools/fingerprint_llm.py) and keeps the
client's reads (`fingerprint.Read`, decoded into a `fingerprint.Response`) and, for a
client that leaves, samples of the server's Prometheus `/metrics`. This module turns them
into measures, each a value with its uncertainty, without a socket or a clock:

- `stream`: the token events as the client could parse them (an SSE event whose delta
  carries text: vLLM sends one token per event by default), grouped into read bursts
  (events that arrive less than BURST_GAP apart are one burst), the time to the first
  token (TTFT), the inter-token gaps and the largest one; `streams` takes several runs
  together: the median of each, half the range as the uncertainty;
- `path_adds`: the same measures through the path against the server directly;
- `stable_headers` for `fingerprint.header_changes`: per-request values (`Date`, request
  ids) compared by name only, as the server writes them anew for each request;
- `compression`: the encoding with and without `Accept-Encoding: gzip`, and whether the
  compressed stream reaches the client in as many bursts as the plain one (`per-frame`)
  or fewer (`held`), in `fingerprint.compression`'s form;
- `cancellation`: after a client leaves mid-stream, how long until the server stops
  generating, read from `vllm:num_requests_running` back at its level before the request
  (the uncertainty is the sampling interval), and the generation tokens counted after the
  leave (`vllm:generation_tokens_total`; an upper bound: other requests count too).

What the server's own timing cannot tell (it writes at its own pace: no shape control)
is `UNMEASURABLE`, named in the document's `not_measured` with the reason.
"""

from __future__ import annotations

import itertools
import json
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from middlebox.scenario import fingerprint as probe_measures
from middlebox.scenario.fingerprint import Response

# Events that arrive less than this apart (seconds) are one burst: a hop that releases a
# held buffer writes it at once, and its TCP segments arrive within microseconds, while a
# decode step of vLLM takes a millisecond or more per token even for a tiny model on a CPU.
BURST_GAP = 0.0005
# A burst this many times the direct one (in token events) is a hold the path adds; under
# it, the difference is the server's own batching and the client's scheduling.
HELD_RATIO = 2.0
# Response header values the server writes anew for every request (RFC 9110 §6.6.1
# `Date`; vLLM's `--enable-request-id-headers`): compared by name only.
VOLATILE = ("date", "x-request-id")

# What needs the probe upstream's shape control (a known schedule and the record of what
# reached the upstream), and why a real server cannot give it.
UNMEASURABLE = (
    "the hold's size, timer or end and X-Accel-Buffering (they need a stream of known bytes "
    "on a known schedule: the probe upstream)",
    "the HTTP version and framing toward the server, and the request headers as they arrive "
    "(they need the probe's record of what reached it)",
    "SSE heartbeats, retry:, id: and Last-Event-ID (the server sends none of them on demand)",
    "the timeouts before and after the head, and a duration cap (they need a server that "
    "holds its head or falls silent for as long as asked)",
)

_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def _text(event: bytes) -> bool:
    """Whether an SSE event's data carries generated text (content or reasoning)."""
    data = b"".join(
        line[5:].lstrip() for line in re.split(rb"\r\n|\r|\n", event) if line.startswith(b"data:")
    )
    if not data or data.strip() == b"[DONE]":
        return False
    try:
        chunk = json.loads(data)
    except ValueError:
        return False
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    for choice in choices or ():
        delta = choice.get("delta") or {} if isinstance(choice, dict) else {}
        text = choice.get("text") if isinstance(choice, dict) else None  # completions
        if text or delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"):
            return True
    return False


def token_events(response: Response) -> list[float]:
    """When each token event became parseable (seconds after the request was sent): the
    end of the read that completed it."""
    return [at for at, _ in _token_events(response)]


def _token_events(response: Response) -> list[tuple[float, int]]:
    """(when, body offset of its end) of each token event."""
    found: list[tuple[float, int]] = []
    start = 0
    body = bytes(response.body)
    for match in _EVENT_END.finditer(body):
        event = body[start : match.start()]
        start = match.end()
        if _text(event):
            for at, received in response.body_at:
                if received >= match.end():
                    found.append((at, match.end()))
                    break
    return found


def _bursts(times: Sequence[float]) -> list[list[float]]:
    bursts: list[list[float]] = []
    for at in times:
        if bursts and at - bursts[-1][-1] < BURST_GAP:
            bursts[-1].append(at)
        else:
            bursts.append([at])
    return bursts


def stream(response: Response) -> dict[str, Any]:
    """One streamed completion as the client saw it: `ttft` (seconds to the first token
    event), `events`, `bursts` (token events per read burst, in order), `burst_events`
    (their median, the last burst left out when there are others: it is the end's), the
    inter-token gaps (`gap_median`, `gap_p90`, `gap_max`: seconds between token events)."""
    events = _token_events(response)
    times = [at for at, _ in events]
    bursts = _bursts(times)
    sizes = [len(b) for b in bursts]
    middle = sizes[:-1] if len(sizes) > 1 else sizes
    ends = list(itertools.accumulate(sizes))
    offsets = [events[end - 1][1] for end in ends]
    nbytes = [b - a for a, b in zip([0, *offsets], offsets, strict=False)]
    middle_bytes = nbytes[:-1] if len(nbytes) > 1 else nbytes
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return {
        "complete": response.complete,
        "events": len(times),
        "ttft": round(times[0], 4) if times else None,
        "bursts": sizes,
        "burst_events": statistics.median(middle) if middle else None,
        "burst_bytes": statistics.median(middle_bytes) if middle_bytes else None,
        "gap_median": round(statistics.median(gaps), 4) if gaps else None,
        "gap_p90": round(gaps[min(len(gaps) - 1, int(len(gaps) * 0.9))], 4) if gaps else None,
        "gap_max": round(gaps[-1], 4) if gaps else None,
    }


def _spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """The median and half the range of the values given (None ones left out)."""
    return probe_measures._spread([v for v in values if v is not None])


STREAM_KEYS = ("ttft", "burst_events", "burst_bytes", "gap_median", "gap_p90", "gap_max")


def streams(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several runs of `stream` together: each measure's median and uncertainty (half the
    range across runs), the runs themselves kept."""
    found: dict[str, Any] = {"runs": [dict(run) for run in runs]}
    for key in STREAM_KEYS:
        found[key] = _spread([run[key] for run in runs])
    return found


def path_adds(path: Mapping[str, Any], direct: Mapping[str, Any]) -> dict[str, Any]:
    """What the path adds to the direct stream: the TTFT and the largest gap (seconds; the
    uncertainties added), the burst's size in token events as a ratio, and `held`: whether
    the bursts are HELD_RATIO times the direct ones or more."""
    found: dict[str, Any] = {}
    for key in ("ttft", "gap_max"):
        a, b = path.get(key), direct.get(key)
        if a is not None and b is not None:
            found[key] = {"value": round(a["value"] - b["value"], 4),
                          "uncertainty": round(a["uncertainty"] + b["uncertainty"], 4)}  # fmt: skip
    a, b = path.get("burst_events"), direct.get("burst_events")
    if a is not None and b is not None and b["value"] > 0:
        found["burst_ratio"] = round(a["value"] / b["value"], 2)
        found["held"] = found["burst_ratio"] >= HELD_RATIO
    return found


def stable_headers(headers: Sequence[Sequence[str]]) -> list[list[str]]:
    """The header fields with VOLATILE values blanked, for `header_changes`."""
    return [[n, "" if n.lower() in VOLATILE else v] for n, v in headers]


def compression(
    unasked: Response, asked: Response, plain: Mapping[str, Any], squeezed: Mapping[str, Any]
) -> dict[str, Any]:
    """`fingerprint.compression` for a real server: `plain` is `stream` of a response to a
    request without Accept-Encoding and `squeezed` of one with `Accept-Encoding: gzip`,
    decoded read by read. The compressed bytes flow (`per-frame`) when they reach the
    client in at least half as many bursts as the plain ones, and are held otherwise;
    `first_frame_wait` is the TTFT they add."""
    held: dict[str, Any] | None = None
    if squeezed["events"] and squeezed["complete"]:
        flows = len(squeezed["bursts"]) * 2 >= len(plain["bursts"])
        late = None
        if squeezed["ttft"] is not None and plain["ttft"] is not None:
            late = round(max(squeezed["ttft"] - plain["ttft"], 0.0), 4)
        held = {
            "release": "none" if flows else "end" if len(squeezed["bursts"]) == 1 else "periodic",
            "bursts": squeezed["bursts"],
            "first_frame_wait": late,
            "max_wait": squeezed["gap_max"],
        }
    elif probe_measures.coding(asked) is not None:
        held = {"release": "incomplete", "bursts": [], "first_frame_wait": None,
                "max_wait": None}  # fmt: skip
    return probe_measures.compression(unasked, asked, held)


# -- cancellation, from /metrics ---------------------------------------------------------------

RUNNING = "vllm:num_requests_running"
GENERATED = "vllm:generation_tokens_total"


def metric(text: str, name: str) -> float | None:
    """The sum of `name` over its label sets in a Prometheus text exposition, None when the
    exposition has no such series."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            try:
                total += float(line.rsplit(" ", 1)[1])
            except ValueError:
                continue
            seen = True
    return total if seen else None


def cancellation(
    samples: Sequence[tuple[float, float, float]], left_at: float, waited: float
) -> dict[str, Any]:
    """How long after a client left (at `left_at`) the server stopped generating: `samples`
    are (time, requests running, generation tokens) from /metrics on the client's clock,
    the first taken before the request, at least one after it began and before the leave;
    `waited`: how long the samples ran after the leave. `stopped` is when running fell back
    to its level before the request, `uncertainty` the interval to the sample before;
    `tokens_after` the generation tokens counted from the last sample before the leave
    to the stop (an upper bound). `seen_running`: False when no sample showed the request
    (a gauge that did not move can tell nothing)."""
    base_running = samples[0][1]
    before = [s for s in samples if s[0] <= left_at]
    after = [s for s in samples if s[0] > left_at]
    seen = any(s[1] > base_running for s in before[1:])
    if not seen or not before:
        return {"seen_running": False, "stopped": None}
    last_before = before[-1]
    previous = last_before
    for sample in after:
        if sample[1] <= base_running:
            return {
                "seen_running": True,
                "stopped": True,
                "after": round(max(sample[0] - left_at, 0.0), 4),
                # it stopped between the sample before (or the leave) and this one
                "uncertainty": round(sample[0] - max(previous[0], left_at), 4),
                "tokens_after": int(sample[2] - last_before[2]),
            }
        previous = sample
    tail = after[-1] if after else last_before
    return {"seen_running": True, "stopped": False, "at_least": round(waited, 3),
            "tokens_after": int(tail[2] - last_before[2])}  # fmt: skip


# -- the summary -------------------------------------------------------------------------------


def _seconds(found: Mapping[str, Any] | None) -> str:
    if found is None:
        return "unknown"
    return f"{found['value']:.2f} s (± {found['uncertainty']:.2f})"


def _stream_line(who: str, found: Mapping[str, Any]) -> str:
    burst = found.get("burst_events")
    size = (
        f"about {burst['value']:.0f} token event{'' if burst['value'] == 1 else 's'} per burst "
        f"(± {burst['uncertainty']:.0f}; {found['burst_bytes']['value']:.0f} bytes)"
        if burst is not None
        else "no token events"
    )
    return (
        f"{who} sees {size}, its first token after {_seconds(found.get('ttft'))}; inter-token "
        f"gaps median {_seconds(found.get('gap_median'))}, the largest "
        f"{_seconds(found.get('gap_max'))}."
    )


def _cancel_line(who: str, found: Mapping[str, Any]) -> str:
    if not found["seen_running"]:
        return (
            f"Cancellation {who}: the server's {RUNNING} never showed the request, so "
            f"when it stopped is unknown (another client's requests, or a gauge that does "
            f"not move)."
        )
    if found["stopped"]:
        return (
            f"A client that leaves {who} is noticed by the server {found['after']:.3f} s later "
            f"(± {found['uncertainty']:.3f} s): it stops generating, {found['tokens_after']} "
            f"token{'' if found['tokens_after'] == 1 else 's'} counted after the leave."
        )
    return (
        f"A client that leaves {who} is not noticed by the server within "
        f"{found['at_least']:.1f} s ({found['tokens_after']} tokens generated since): the "
        f"server generates for nobody."
    )


def summary(document: Mapping[str, Any]) -> list[str]:
    """The fingerprint against an LLM server in sentences, one measure a line."""
    measures = document["measures"]
    lines = [f"Path {document['url']} (an LLM server, model {document['model']}):"]
    direct = document.get("direct")
    adds = document.get("path_adds") or {}
    if adds.get("held"):
        ttft = adds.get("ttft")
        late = f" and its first token {ttft['value']:.2f} s late" if ttft else ""
        size = measures["stream"]["burst_bytes"]["value"]
        lines.append(
            f"This path holds ~{probe_measures._size(size)} of the stream at a time: a client "
            f"sees {adds['burst_ratio']:.0f} times the server's token events per burst{late}."
        )
    elif "held" in adds:
        ttft = adds.get("ttft")
        lines.append(
            "This path holds nothing a client can see: bursts as the server's"
            + (f", the first token {ttft['value']:+.2f} s against directly." if ttft else ".")
        )
    if "stream" in measures:
        lines.append(_stream_line("Through the path, a client", measures["stream"]))
    if direct is not None and "stream" in direct["measures"]:
        lines.append(_stream_line("Directly, a client", direct["measures"]["stream"]))
    shared = {k: measures[k] for k in ("response_headers", "compression") if k in measures}
    lines += probe_measures.summary({"url": "", "measures": shared})[1:]
    for who, part in (("through the path", measures), ("directly", (direct or {}).get(
            "measures", {}))):  # fmt: skip
        if "cancel" in part:
            lines.append(_cancel_line(who, part["cancel"]))
    lines += [f"Not measured: {item}." for item in document.get("not_measured", [])]
    return lines
