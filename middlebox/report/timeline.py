"""Timelines of a run: upstream token emission against what the client displayed.

For each (scenario, client) run and each logical request, the data are: the times the
upstream generated each token (the emulator's ledger, every generation of the request,
retries included), the times the client showed each piece (its result file), the
faults' decisions (the journal), and the gaps and bursts between shown pieces. A
smooth stream shows two staircases a constant latency apart; a buffering proxy shows
the client's staircase as a few tall steps (bursts); an idle cut shows the client's
line stopping while the upstream's goes on.

`timeline_data` builds plain JSON (kept next to the journals); `write_png` draws it
with matplotlib (Agg, no display needed) and `svg` draws it as inline SVG for the
HTML report, without matplotlib.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any

from middlebox.observe.journal import JournalView
from middlebox.observe.requests import BURST_GAP, ledger_for

MAX_PANELS = 8


def timeline_data(
    scenario: str,
    client: str,
    tags: Sequence[str],
    ledger: Sequence[Mapping[str, Any]],
    result: Mapping[str, Any] | None,
    journal: Sequence[JournalView],
    verdicts: Sequence[str] = (),
) -> dict[str, Any]:
    """Per request: times relative to its start, of tokens generated and pieces shown."""
    results = {int(r["index"]): r for r in (result or {}).get("results", [])}
    faults = sorted(
        (float(f["time"]), f"{f['fault']}:{f['action']}") for view in journal for f in view.faults
    )
    requests = []
    for index, tag in enumerate(tags):
        entries = ledger_for(ledger, tag)
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
        end = max(
            [*tokens, *times, float(shown.get("ended_at") or origin) - origin, 0.0], default=0.0
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
                "error": shown.get("error"),
                "ended": _rel(shown.get("ended_at"), origin),
                # decisions taken while this request was in flight (a keep-alive
                # connection's earlier decisions belong to the earlier request)
                "faults": [[t - origin, label] for t, label in faults if 0.0 <= t - origin <= end],
                "end": end,
            }
        )
    return {"scenario": scenario, "client": client, "requests": requests}


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


# ------------------------------------------------------------------------ PNG


def write_png(data: Mapping[str, Any], path: Path) -> Path:
    """One panel per request (at most MAX_PANELS): upstream tokens and shown pieces,
    cumulative, with bursts, the largest gap and fault markers."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    requests = list(data["requests"])[:MAX_PANELS] or [
        {"index": 0, "tokens": [], "shown": [], "faults": [], "bursts": [], "verdict": "no data"}
    ]
    height = 2.3 * len(requests) + 0.6
    figure = Figure(figsize=(9, height), dpi=72)
    axes = figure.subplots(len(requests), 1, squeeze=False)[:, 0]
    # fixed margins instead of tight_layout(), which costs more than the drawing
    figure.subplots_adjust(left=0.07, right=0.98, top=1 - 0.8 / height, bottom=0.5 / height,
                           hspace=0.45)  # fmt: skip
    figure.suptitle(f"{data['scenario']} / {data['client']}", fontsize=11)
    for ax, request in zip(axes, requests, strict=True):
        tokens, shown = request["tokens"], request["shown"]
        if tokens:
            ax.step(tokens, range(1, len(tokens) + 1), where="post", label="upstream tokens")
        if shown:
            ax.step(shown, range(1, len(shown) + 1), where="post", label="client shown")
        for start, end, count in request["bursts"]:
            if count > 1:
                ax.axvspan(start, end + 0.002, color="orange", alpha=0.3)
        gap = request.get("largest_gap")
        if gap and gap[1] - gap[0] > BURST_GAP:
            ax.axvspan(gap[0], gap[1], color="grey", alpha=0.15, label="largest gap")
        labelled: set[str] = set()
        for when, label in request["faults"][:20]:
            ax.axvline(when, color="red", linestyle=":", linewidth=1)
            if label in labelled:
                continue  # one label per kind of decision keeps the panel readable
            labelled.add(label)
            ax.text(
                when,
                0.02,
                label,
                transform=ax.get_xaxis_transform(),
                fontsize=6,
                color="red",
                rotation=90,
                va="bottom",
            )
        ax.set_xlim(left=min([0.0, *(when for when, _ in request["faults"][:20])]))
        if request.get("ended") is not None and request.get("error"):
            ax.axvline(request["ended"], color="purple", linewidth=1, label="error surfaced")
        ax.set_title(f"request {request['index']}: {request.get('verdict', '')}", fontsize=9)
        ax.set_ylabel("count", fontsize=8)
        ax.tick_params(labelsize=7)
        if ax is axes[0] and ax.get_legend_handles_labels()[0]:  # nothing drawn: no legend
            ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("seconds since the request started", fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


# ------------------------------------------------------------------------ SVG


def svg(request: Mapping[str, Any], width: int = 640, height: int = 160) -> str:
    """One request's timeline as a self-contained inline SVG (no scripts, no fonts)."""
    pad = 30
    tokens, shown = request.get("tokens") or [], request.get("shown") or []
    end = max(float(request.get("end") or 0.0), *(tokens or [0.0]), *(shown or [0.0]), 0.001)
    top = max(len(tokens), len(shown), 1)

    def x(t: float) -> float:
        return float(pad + (width - 2 * pad) * max(t, 0.0) / end)

    def y(n: int) -> float:
        return height - pad - (height - 2 * pad) * n / top

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

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" class="timeline">',
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fff"/>',
    ]
    gap = request.get("largest_gap")
    if gap and gap[1] - gap[0] > BURST_GAP:
        parts.append(
            f'<rect x="{x(gap[0]):.1f}" y="{pad}" width="{max(x(gap[1]) - x(gap[0]), 1):.1f}" '
            f'height="{height - 2 * pad}" fill="#ddd"><title>largest gap '
            f"{(gap[1] - gap[0]) * 1000:.0f} ms</title></rect>"
        )
    for start, stop, count in request.get("bursts") or []:
        if count > 1:
            wide = max(x(stop) - x(start), 0) + 4
            parts.append(
                f'<rect x="{x(start) - 2:.1f}" y="{pad}" width="{wide:.1f}" '
                f'height="{height - 2 * pad}" fill="#fc9" opacity="0.6"><title>burst of '
                f"{int(count)} pieces</title></rect>"
            )
    parts.append(staircase(tokens, "#1f77b4", "upstream tokens"))
    parts.append(staircase(shown, "#ff7f0e", "client shown"))
    for when, label in (request.get("faults") or [])[:20]:
        parts.append(
            f'<line x1="{x(when):.1f}" x2="{x(when):.1f}" y1="{pad}" y2="{height - pad}" '
            f'stroke="red" stroke-dasharray="2,2"><title>{html.escape(str(label))}</title></line>'
        )
    parts.append(
        f'<line x1="{pad}" x2="{width - pad}" y1="{height - pad}" y2="{height - pad}" '
        f'stroke="#333"/><text x="{pad}" y="{height - 8}" font-size="10">0 s</text>'
        f'<text x="{width - pad}" y="{height - 8}" font-size="10" text-anchor="end">'
        f"{end:.2f} s</text>"
        f'<text x="{pad}" y="14" font-size="10">blue: upstream tokens ({len(tokens)}), '
        f"orange: client shown ({len(shown)}), red: fault decisions</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


def save_data(data: Mapping[str, Any], path: Path) -> None:
    path.write_text(json.dumps(data, indent=1))
