"""Timelines of a run: upstream token emission against what the client displayed.

For each (scenario, client) run and each logical request, the data are: the times the
upstream generated each token (the emulator's ledger, every generation of the request,
retries included), how many tokens the upstream planned (the ledger's `planned_tokens`),
the times the client showed each piece (its result file), the faults' decisions (the
journal), and the gaps and bursts between shown pieces. A smooth stream shows two
staircases a constant latency apart reaching the planned line; a buffering proxy shows
the client's staircase as a few tall steps (bursts); an idle cut or a silent truncation
shows both staircases stopping below the planned line, with an end-of-stream marker
that says no finish_reason or `[DONE]` arrived (in the API's own words: no
`response.completed`, no `stop_reason` or `message_stop`).

`timeline_data` builds plain JSON (kept next to the journals); `write_png` draws it
with matplotlib (Agg, no display needed) and `svg` draws it as inline SVG for the
HTML report, without matplotlib. Both label fault decisions by number in one row
(decisions closer than a label's width share a number) with a key beside the panel,
so labels never overlap however densely a fault fires.
"""

from __future__ import annotations

import html
import json
import math
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from middlebox.core.dialects import Dialect, EndKind, dialect_for, end_of_reason
from middlebox.observe.journal import JournalView
from middlebox.observe.requests import BURST_GAP, ledger_for, tokens_reached

MAX_PANELS = 8
# the key beside a panel holds this many fault lines; the rest are in timeline.json
MAX_KEY_LINES = 11
FAULT_LABEL_GID = "fault-label"


def timeline_data(
    scenario: str,
    client: str,
    tags: Sequence[str],
    ledger: Sequence[Mapping[str, Any]],
    result: Mapping[str, Any] | None,
    journal: Sequence[JournalView],
    verdicts: Sequence[str] = (),
    *,
    description: str = "",
    seed: int | None = None,
) -> dict[str, Any]:
    """Per request: times relative to its start, of tokens generated and pieces shown,
    with the planned length, the first-token times and how the stream ended."""
    results = {int(r["index"]): r for r in (result or {}).get("results", [])}
    faults = sorted(
        (float(f["time"]), f"{f['fault']}:{f['action']}") for view in journal for f in view.faults
    )
    requests = []
    spoken = journal_api(journal)
    for index, tag in enumerate(tags):
        entries = ledger_for(ledger, tag)
        endpoints = {str(e.get("endpoint")) for e in entries if e.get("endpoint")}
        shown = results.get(index) or {}
        starts = [float(e["received_at"]) for e in entries if e.get("received_at")]
        origin = float(shown.get("started_at") or min(starts, default=0.0))
        tokens = sorted(
            float(t) - origin for entry in entries for t in entry.get("token_times") or []
        )
        pieces = [
            (float(t) - origin, len(str(text))) for t, text in shown.get("chunks") or [] if text
        ]
        times = [t for t, _ in pieces]
        gaps = [(a, b) for a, b in pairwise(times)]
        largest = max(gaps, key=lambda gap: gap[1] - gap[0], default=None)
        bursts = _bursts(times)
        ended_at = shown.get("ended_at")
        reached = tokens_reached(entries, None if ended_at is None else float(ended_at))
        end = max(
            [*tokens, *times, float(shown.get("ended_at") or origin) - origin, 0.0], default=0.0
        )
        planned = [int(e["planned_tokens"]) for e in entries if e.get("planned_tokens")]
        first = next((e for e in entries if e.get("received_at")), None)
        upstream_ttft = (
            (float(first["first_token_at"]) - float(first["received_at"])) * 1000
            if first and first.get("first_token_at")
            else None
        )
        requests.append(
            {
                "index": index,
                "verdict": verdicts[index] if index < len(verdicts) else "",
                "generations": [
                    {
                        "received": float(e["received_at"]) - origin,
                        "finished": _rel(e.get("finished_at"), origin),
                        "aborted": _rel(e.get("aborted_at"), origin),
                        "disconnected": _rel(e.get("disconnected_at"), origin),
                    }
                    for e in entries
                    if e.get("received_at")
                ],
                "tokens": tokens,
                "shown": times,
                "bursts": bursts,
                "largest_gap": list(largest) if largest else None,
                # the length the upstream meant to send: a stream that stops below it
                # was cut, however healthy its staircase looks
                "planned": max(planned, default=None),
                "perceived_ttft_ms": times[0] * 1000 if times else None,
                "upstream_ttft_ms": upstream_ttft,
                # of the tokens generated while the client was there: those made for
                # nobody after it left are on the staircase, never in its bursts
                "tokens_per_burst": reached / len(bursts) if bursts else None,
                "largest_gap_ms": (largest[1] - largest[0]) * 1000 if largest else None,
                "finish_reason": shown.get("finish_reason"),
                "saw_done": shown.get("saw_done"),
                # the API it spoke, whose words the end marker uses: the emulator's ledger
                # says, else the run's requests on the wire when they all spoke one
                "api": endpoints.pop() if len(endpoints) == 1 else spoken,
                "error": shown.get("error"),
                "ended": _rel(shown.get("ended_at"), origin),
                # decisions taken while this request was in flight (a keep-alive
                # connection's earlier decisions belong to the earlier request)
                "faults": [[t - origin, label] for t, label in faults if 0.0 <= t - origin <= end],
                "end": end,
            }
        )
    return {
        "scenario": scenario,
        "client": client,
        "description": description,
        "seed": seed,
        "requests": requests,
    }


def _rel(value: Any, origin: float) -> float | None:
    return None if value is None else float(value) - origin


def _bursts(times: Sequence[float]) -> list[list[float]]:
    """Runs of pieces shown within BURST_GAP of each other: [start, end, count]."""
    out: list[list[float]] = []
    for t in times:
        if out and t - out[-1][1] <= BURST_GAP:
            out[-1][1] = t
            out[-1][2] += 1
        else:
            out.append([t, t, 1])
    return out


# ------------------------------------------------------- shared by both drawings


@dataclass
class FaultMark:
    """One numbered marker: the decisions too close together to label apart."""

    number: int
    decisions: list[tuple[float, str]] = field(default_factory=list)

    @property
    def time(self) -> float:
        return self.decisions[0][0]

    def key(self, unit: TimeUnit) -> str:
        """`3: 420-1114 ms proxy_buffering:released x4`, for the key beside the panel."""
        first, last = self.decisions[0][0], self.decisions[-1][0]
        when = unit.text(first) if first == last else f"{unit.number(first)}-{unit.text(last)}"
        counts: dict[str, int] = {}
        for _, label in self.decisions:
            counts[label] = counts.get(label, 0) + 1
        labels = ", ".join(f"{label} x{n}" if n > 1 else label for label, n in counts.items())
        return f"{self.number}: {when} {labels}"


def fault_marks(
    faults: Sequence[Sequence[Any]], position: Callable[[float], float], label_width: float
) -> list[FaultMark]:
    """Number the fault decisions left to right; a decision whose label would start
    within `label_width` (in `position`'s units, pixels) of the previous label joins it,
    so the number labels, drawn in one row at each mark's first decision, never overlap."""
    marks: list[FaultMark] = []
    for when, label in sorted((float(t), str(text)) for t, text in faults):
        if marks and position(when) - position(marks[-1].time) < label_width:
            marks[-1].decisions.append((when, label))
        else:
            marks.append(FaultMark(len(marks) + 1, [(when, label)]))
    return marks


@dataclass(frozen=True)
class TimeUnit:
    """Milliseconds for streams under two seconds (most), seconds beyond."""

    scale: float
    name: str

    @staticmethod
    def for_span(seconds: float) -> TimeUnit:
        return TimeUnit(1000.0, "ms") if seconds < 2.0 else TimeUnit(1.0, "s")

    def number(self, seconds: float) -> str:
        value = seconds * self.scale
        return f"{value:.0f}" if self.name == "ms" else f"{value:.2f}"

    def text(self, seconds: float) -> str:
        return f"{self.number(seconds)} {self.name}"


def journal_api(journal: Sequence[JournalView]) -> str | None:
    """The one streaming API a run's requests spoke, by the request lines on its journal
    (`middlebox.core.dialects.dialect_for`); None when they spoke none or several."""
    found: set[Dialect] = set()
    for view in journal:
        for line in view.boundaries:
            parts = str(line.get("start_line") or "").split(" ")
            if line.get("type") != "http_head" or len(parts) < 3 or parts[0].startswith("HTTP/"):
                continue
            dialect = dialect_for(parts[0], parts[1])
            if dialect is not None:
                found.add(dialect)
    return found.pop().value if len(found) == 1 else None


def end_of_stream(request: Mapping[str, Any]) -> tuple[str, bool]:
    """How the stream ended, as the end marker's label in its API's own words (the
    request's `api`, a `middlebox.core.dialects.Dialect` value; chat's when unknown), and
    whether that is a proper end, which the scorer needs to call an answer complete
    rather than silently truncated: a finish_reason or vLLM's `data: [DONE]` on chat and
    completions, a Responses stream's terminal event (`response.completed`, whose status
    or `incomplete_details.reason` the client reports), a Messages stream's `stop_reason`
    (in its `message_delta`, before `message_stop`)."""
    if request.get("error"):
        return f"error: {str(request['error'])[:60]}", True
    reason, done = request.get("finish_reason"), request.get("saw_done")
    api = request.get("api")
    if api == Dialect.RESPONSES.value:
        if not reason:
            return "no response.completed", False
        if end_of_reason(reason) is EndKind.LENGTH:
            return f"response.completed, incomplete {reason}", True
        if reason == "completed":
            return "response.completed", True
        return f"response.completed, status {reason}", True
    if api == Dialect.MESSAGES.value:
        if not reason:
            return "no stop_reason, no message_stop", False
        return f"message_stop, stop_reason {reason}", True
    if reason and done:
        return f"finish_reason {reason} + [DONE]", True
    if reason:
        return f"finish_reason {reason}, no [DONE]", True
    if done:
        return "[DONE] without finish_reason", False
    return "no finish_reason, no [DONE]", False


def key_numbers(request: Mapping[str, Any]) -> list[str]:
    """The numbers that name a request's symptom, for beside its timeline."""

    def ms(value: Any) -> str:
        return "-" if value is None else f"{float(value):.0f} ms"

    tokens, shown = request.get("tokens") or [], request.get("shown") or []
    planned = request.get("planned")
    per_burst = request.get("tokens_per_burst")
    bursts = len(request.get("bursts") or [])
    of_planned = f" of {planned} planned" if planned else ""
    lines = [
        f"TTFT {ms(request.get('perceived_ttft_ms'))} "
        f"(upstream {ms(request.get('upstream_ttft_ms'))})",
        f"tokens {len(tokens)}{of_planned}, {len(shown)} pieces shown",
        f"tokens/burst {'-' if per_burst is None else f'{per_burst:.1f}'} ({bursts} bursts)",
        f"largest gap {ms(request.get('largest_gap_ms'))}",
    ]
    if request.get("ended") is not None or request.get("error"):
        label, _ = end_of_stream(request)
        lines.append(f"end: {label}")
    return lines


def _wrapped(text: str, width: int, lines: int) -> list[str]:
    """`text` in at most `lines` lines of `width`, the last ending in "..." when cut."""
    wrapped = textwrap.wrap(text, width)
    if len(wrapped) <= lines:
        return wrapped
    return [
        *wrapped[: lines - 1],
        textwrap.shorten(" ".join(wrapped[lines - 1 :]), width, placeholder=" ..."),
    ]


def _header(data: Mapping[str, Any]) -> str:
    seed = data.get("seed")
    return f"{data['scenario']} / {data['client']}" + (
        f" · seed {seed}" if seed is not None else ""
    )


# ------------------------------------------------------------------------ PNG

COLOURS = {
    "tokens": "#1f77b4",
    "shown": "#ff7f0e",
    "planned": "#555555",
    "ttft": "#2ca02c",
    "end_ok": "#000000",
    "end_bad": "#c62828",
    "fault": "#d62728",
}


def draw(data: Mapping[str, Any]) -> Any:
    """The timeline figure (matplotlib `Figure`, Agg): a header with the scenario, seed
    and description, then one panel per request (at most MAX_PANELS) with its key
    numbers and fault key beside it."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    requests = list(data["requests"])[:MAX_PANELS] or [
        {"index": 0, "tokens": [], "shown": [], "faults": [], "bursts": [], "verdict": "no data"}
    ]
    description = _wrapped(str(data.get("description") or ""), 150, 4)
    # title, description, a two-row legend, then the first panel's title
    legend_top = 0.42 + 0.15 * len(description)
    head = legend_top + 0.7
    height = 2.5 * len(requests) + head + 0.45
    figure = Figure(figsize=(12, height), dpi=72)
    axes = figure.subplots(len(requests), 1, squeeze=False)[:, 0]
    # fixed margins instead of tight_layout(), which costs more than the drawing; the
    # right third holds each panel's numbers and fault key
    figure.subplots_adjust(left=0.065, right=0.64, top=1 - head / height, bottom=0.5 / height,
                           hspace=0.5)  # fmt: skip
    figure.text(0.5, 1 - 0.12 / height, _header(data), ha="center", va="top", fontsize=12)
    if description:
        figure.text(0.5, 1 - 0.38 / height, "\n".join(description), ha="center", va="top",
                    fontsize=8, color="#333")  # fmt: skip
    handles = [
        Line2D([], [], color=COLOURS["tokens"], label="upstream tokens"),
        Line2D([], [], color=COLOURS["shown"], label="client pieces shown"),
        Line2D([], [], color=COLOURS["planned"], linestyle="--", label="planned length"),
        Line2D([], [], color=COLOURS["ttft"], linestyle="-.", label="client TTFT"),
        Line2D([], [], color=COLOURS["tokens"], marker="v", linestyle="",
               label="upstream 1st token"),
        Line2D([], [], color=COLOURS["end_ok"], label="end of stream (red: no proper end)"),
        Line2D([], [], color=COLOURS["fault"], linestyle=":", label="fault decision (n: key)"),
        Patch(color="orange", alpha=0.3, label="burst"),
        Patch(color="grey", alpha=0.2, label="largest gap"),
    ]  # fmt: skip
    figure.legend(handles=handles, loc="upper center", ncol=5, fontsize=7, frameon=False,
                  bbox_to_anchor=(0.5, 1 - legend_top / height))  # fmt: skip
    renderer = FigureCanvasAgg(figure).get_renderer()  # type: ignore[no-untyped-call]
    for ax, request in zip(axes, requests, strict=True):
        _panel(ax, request, renderer, FuncFormatter, MaxNLocator)
    return figure


def _panel(
    ax: Any, request: Mapping[str, Any], renderer: Any, formatter: Any, locator: Any
) -> None:
    tokens, shown = request.get("tokens") or [], request.get("shown") or []
    planned = request.get("planned")
    end = span(request)
    unit = TimeUnit.for_span(end)
    ax.set_xlim(0.0, end * 1.03)
    ax.set_ylim(0, max(planned or 0, len(tokens), len(shown), 1) * 1.15)
    ax.xaxis.set_major_formatter(formatter(lambda value, _: unit.number(value)))
    ax.yaxis.set_major_locator(locator(integer=True, nbins=5))
    if tokens:
        ax.step([0.0, *tokens], range(len(tokens) + 1), where="post", color=COLOURS["tokens"])
        ax.plot([tokens[0]], [1], marker="v", color=COLOURS["tokens"], markersize=6)
    if shown:
        ax.step([0.0, *shown], range(len(shown) + 1), where="post", color=COLOURS["shown"])
    if planned:
        ax.axhline(planned, color=COLOURS["planned"], linestyle="--", linewidth=1)
        ax.text(0.005, planned, f" planned {planned}", transform=ax.get_yaxis_transform(),
                fontsize=7, color=COLOURS["planned"], va="bottom")  # fmt: skip
    for start, stop, count in request.get("bursts") or []:
        if count > 1:
            ax.axvspan(start, stop + 0.002, color="orange", alpha=0.3)
    gap = request.get("largest_gap")
    if gap and gap[1] - gap[0] > BURST_GAP:
        ax.axvspan(gap[0], gap[1], color="grey", alpha=0.2)
    if shown:
        ax.axvline(shown[0], color=COLOURS["ttft"], linestyle="-.", linewidth=1)
    if request.get("ended") is not None:
        _, proper = end_of_stream(request)
        colour = COLOURS["end_ok"] if proper else COLOURS["end_bad"]
        ax.axvline(request["ended"], color=colour, linewidth=1.5)
    # fault numbers: one row just inside the top edge, a mark per label's width
    box = ax.get_window_extent(renderer)
    pixels_per_second = box.width / (end * 1.03)
    # an 8 pt digit is under 5 px at 72 dpi: 18 px holds three digits and the box padding
    marks = fault_marks(request.get("faults") or [], lambda t: t * pixels_per_second, 18.0)
    for mark in marks:
        for when, _ in mark.decisions:
            ax.axvline(when, color=COLOURS["fault"], linestyle=":", linewidth=1)
        ax.text(mark.time, 0.985, str(mark.number), transform=ax.get_xaxis_transform(),
                fontsize=8, color=COLOURS["fault"], ha="left", va="top", gid=FAULT_LABEL_GID,
                bbox={"boxstyle": "square,pad=0.1", "facecolor": "white",
                      "edgecolor": "none"})  # fmt: skip
    ax.set_title(f"request {request['index']}: {request.get('verdict', '')}", fontsize=9,
                 loc="left")  # fmt: skip
    ax.set_ylabel("tokens / pieces", fontsize=8)
    ax.set_xlabel(f"time since the request started ({unit.name})", fontsize=8)
    ax.tick_params(labelsize=7)
    side = key_numbers(request)
    keys = [mark.key(unit) for mark in marks]
    if len(keys) > MAX_KEY_LINES:
        keys = [
            *keys[: MAX_KEY_LINES - 1],
            f"... {len(keys) - MAX_KEY_LINES + 1} more (timeline.json)",
        ]
    if keys:
        side += ["faults:", *(textwrap.shorten(key, 62, placeholder="...") for key in keys)]
    ax.text(1.02, 1.0, "\n".join(side), transform=ax.transAxes, fontsize=7, va="top",
            family="monospace")  # fmt: skip


def write_png(data: Mapping[str, Any], path: Path) -> Path:
    """`draw(data)` saved as a PNG."""
    figure = draw(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


# ------------------------------------------------------------------------ SVG

SVG_LEFT, SVG_RIGHT, SVG_TOP, SVG_BOTTOM = 46, 22, 26, 34


def svg(request: Mapping[str, Any], width: int = 720, height: int = 200) -> str:
    """One request's timeline as a self-contained inline SVG (no scripts, no fonts):
    labelled axes with ticks, both staircases, the planned length, TTFT and end markers,
    bursts, the largest gap and numbered fault markers (`svg_fault_marks` is their key)."""
    tokens, shown = request.get("tokens") or [], request.get("shown") or []
    planned = request.get("planned")
    end = span(request)
    unit = TimeUnit.for_span(end)
    top = max(planned or 0, len(tokens), len(shown), 1) * 1.1
    plot_w = width - SVG_LEFT - SVG_RIGHT
    plot_h = height - SVG_TOP - SVG_BOTTOM
    bottom = height - SVG_BOTTOM
    e = html.escape

    def x(t: float) -> float:
        return float(SVG_LEFT + plot_w * min(max(t, 0.0), end) / end)

    def y(n: float) -> float:
        return float(bottom - plot_h * n / top)

    def staircase(times: Sequence[float], colour: str, label: str) -> str:
        if not times:
            return ""
        points = [f"{x(0):.1f},{y(0):.1f}"]
        for n, t in enumerate(times, start=1):
            points += [f"{x(t):.1f},{y(n - 1):.1f}", f"{x(t):.1f},{y(n):.1f}"]
        return (
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
            f'points="{" ".join(points)}"><title>{label}</title></polyline>'
        )

    def vline(t: float, colour: str, title: str, dash: str = "") -> str:
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        return (
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{SVG_TOP}" y2="{bottom}" '
            f'stroke="{colour}"{dashes}><title>{e(title)}</title></line>'
        )

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" class="timeline" font-family="sans-serif">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
    ]
    gap = request.get("largest_gap")
    if gap and gap[1] - gap[0] > BURST_GAP:
        parts.append(
            f'<rect x="{x(gap[0]):.1f}" y="{SVG_TOP}" width="{max(x(gap[1]) - x(gap[0]), 1):.1f}" '
            f'height="{plot_h}" fill="#ddd"><title>largest gap '
            f"{(gap[1] - gap[0]) * 1000:.0f} ms</title></rect>"
        )
    for start, stop, count in request.get("bursts") or []:
        if count > 1:
            wide = max(x(stop) - x(start), 0) + 4
            parts.append(
                f'<rect x="{x(start) - 2:.1f}" y="{SVG_TOP}" width="{wide:.1f}" '
                f'height="{plot_h}" fill="#fc9" opacity="0.6"><title>burst of '
                f"{int(count)} pieces</title></rect>"
            )
    # axes: ticks and labels on both
    parts.append(
        f'<line x1="{SVG_LEFT}" x2="{width - SVG_RIGHT}" y1="{bottom}" y2="{bottom}" '
        'stroke="#333"/>'
        f'<line x1="{SVG_LEFT}" x2="{SVG_LEFT}" y1="{SVG_TOP}" y2="{bottom}" stroke="#333"/>'
    )
    for t in _x_ticks(end, unit):
        parts.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{bottom}" y2="{bottom + 4}" stroke="#333"/>'
            f'<text x="{x(t):.1f}" y="{bottom + 14}" font-size="10" text-anchor="middle" '
            f'class="tick">{unit.number(t)}</text>'
        )
    for n in _y_ticks(top):
        parts.append(
            f'<line x1="{SVG_LEFT - 4}" x2="{SVG_LEFT}" y1="{y(n):.1f}" y2="{y(n):.1f}" '
            'stroke="#333"/>'
            f'<text x="{SVG_LEFT - 6}" y="{y(n) + 3:.1f}" font-size="10" text-anchor="end" '
            f'class="tick">{n}</text>'
        )
    parts.append(
        f'<text x="{SVG_LEFT + plot_w / 2:.0f}" y="{height - 4}" font-size="10" '
        f'text-anchor="middle">time since the request started ({unit.name})</text>'
        f'<text x="11" y="{SVG_TOP + plot_h / 2:.0f}" font-size="10" text-anchor="middle" '
        f'transform="rotate(-90 11 {SVG_TOP + plot_h / 2:.0f})">tokens / pieces</text>'
    )
    if planned:
        parts.append(
            f'<line x1="{SVG_LEFT}" x2="{width - SVG_RIGHT}" y1="{y(planned):.1f}" '
            f'y2="{y(planned):.1f}" stroke="#555" stroke-dasharray="6,3" class="planned">'
            f"<title>planned {planned} tokens</title></line>"
            f'<text x="{SVG_LEFT + 4}" y="{y(planned) - 3:.1f}" font-size="9" fill="#555">'
            f"planned {planned}</text>"
        )
    parts.append(staircase(tokens, "#1f77b4", "upstream tokens"))
    parts.append(staircase(shown, "#ff7f0e", "client pieces shown"))
    if shown:
        parts.append(vline(shown[0], "#2ca02c", f"client TTFT {shown[0] * 1000:.0f} ms", "5,2,1,2"))
    if tokens:
        parts.append(
            f'<path d="M{x(tokens[0]) - 4:.1f},{y(1) - 8:.1f} h8 l-4,7 z" fill="#1f77b4">'
            f"<title>upstream first token {tokens[0] * 1000:.0f} ms</title></path>"
        )
    if request.get("ended") is not None:
        label, proper = end_of_stream(request)
        parts.append(vline(float(request["ended"]), "#000" if proper else "#c62828",
                           f"end of stream: {label}"))  # fmt: skip
    for mark in svg_fault_marks(request, width):
        for when, label in mark.decisions:
            parts.append(vline(when, "red", label, "2,2"))
        parts.append(
            f'<text x="{x(mark.time) + 1:.1f}" y="{SVG_TOP - 6}" font-size="10" fill="#d62728" '
            f'class="fault-label"><title>{e(mark.key(unit))}</title>{mark.number}</text>'
        )
    parts.append(
        f'<text x="{SVG_LEFT}" y="11" font-size="10" class="legend">blue: upstream tokens '
        f"({len(tokens)}) · orange: client pieces ({len(shown)}) · dashed: planned · green: "
        "TTFT · end: black, red when improper · red n: fault</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def svg_fault_marks(request: Mapping[str, Any], width: int = 720) -> list[FaultMark]:
    """The numbered fault marks `svg(request, width)` draws, for the key beside it."""
    faults = request.get("faults") or []
    per_second = (width - SVG_LEFT - SVG_RIGHT) / span(request)
    # a 10 px sans-serif digit is under 6.5 px wide; the widest number bounds every label
    label_width = 6.5 * len(str(len(faults))) + 4
    return fault_marks(faults, lambda t: t * per_second, label_width)


def _nice_step(raw: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least `raw` (> 0)."""
    power = 10.0 ** math.floor(math.log10(raw))
    return next(power * m for m in (1.0, 2.0, 2.5, 5.0, 10.0) if power * m >= raw * (1 - 1e-9))


def _y_ticks(top: float) -> list[int]:
    """Round tick values from 0 to `top`, about five of them, whole numbers."""
    step = max(1, math.ceil(_nice_step(max(top / 4, 1.0))))
    return list(range(0, int(top) + 1, step))


def _x_ticks(end: float, unit: TimeUnit) -> list[float]:
    """Round times (in `unit`) from 0 to `end` seconds, about five, as seconds."""
    step = _nice_step(end * unit.scale / 4) / unit.scale
    return [n * step for n in range(int(end / step + 1e-9) + 1)]


def span(request: Mapping[str, Any]) -> float:
    """Seconds a request's timeline spans: to its last token, piece or end."""
    tokens, shown = request.get("tokens") or [], request.get("shown") or []
    return float(max(float(request.get("end") or 0.0), *tokens, *shown, 0.001))


def time_unit(request: Mapping[str, Any]) -> TimeUnit:
    """The unit a request's timeline is drawn in (for its fault key)."""
    return TimeUnit.for_span(span(request))


def save_data(data: Mapping[str, Any], path: Path) -> None:
    path.write_text(json.dumps(data, indent=1))
