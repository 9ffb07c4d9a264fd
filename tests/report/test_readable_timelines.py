"""Timelines a person can read: labelled axes and ticks, the planned length (so a silent
truncation stops visibly short), TTFT and end-of-stream markers, the key numbers beside
each panel, the scenario's description and seed on top, and fault labels that never
overlap however densely a fault fires; checked in matplotlib's own text extents, in the
SVG's geometry and in headless Chromium's screenshots."""

from __future__ import annotations

import itertools
import shutil
import subprocess
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from click.testing import CliRunner

from middlebox.clients.browser import without_priority_raise
from middlebox.observe.journal import JournalView
from middlebox.report.html_page import render, seed_line
from middlebox.report.timeline import (
    FAULT_LABEL_GID,
    TimeUnit,
    draw,
    end_of_stream,
    fault_marks,
    key_numbers,
    svg,
    svg_fault_marks,
    timeline_data,
    write_png,
)
from tests.harness import needs

TAG = "[middlebox s/c/0]"
DESCRIPTION = "A hop closes the stream cleanly after 12 tokens; the fix: check finish_reason."
# the upstream planned 40 tokens and sent 12 before the hop closed the stream
LEDGER = [
    {
        "prompt": [{"role": "user", "content": f"{TAG} hello"}],
        "received_at": 100.0,
        "first_token_at": 100.06,
        "token_times": [100.06 + 0.015 * n for n in range(12)],
        "planned_tokens": 40,
        "finished_at": None,
    }
]
RESULT = {
    "results": [
        {
            "index": 0,
            "started_at": 99.9,
            "ended_at": 100.5,
            "chunks": [[100.2 + 0.02 * n, "tok"] for n in range(12)],
            "finish_reason": None,
            "saw_done": False,
            "error": None,
        }
    ]
}
# a slicer deciding every 2 ms (27 decisions in 52 ms) and a cut at the end: the kind of
# density that smeared the old labels into one red bar
DENSE = [{"time": 100.1 + 0.002 * n, "fault": "slicer", "action": "sliced"} for n in range(27)]
JOURNAL = [JournalView(1, faults=[*DENSE, {"time": 100.42, "fault": "cut", "action": "cut"}])]


def data() -> dict[str, Any]:
    return timeline_data(
        "clean-close", "openai", [TAG], LEDGER, RESULT, JOURNAL, ["silent_truncation"],
        description=DESCRIPTION, seed=32,
    )  # fmt: skip


def request() -> dict[str, Any]:
    return dict(data()["requests"][0])


def test_the_data_carry_the_planned_length_first_tokens_and_how_the_stream_ended() -> None:
    timeline = data()
    assert (timeline["description"], timeline["seed"]) == (DESCRIPTION, 32)
    one = timeline["requests"][0]
    assert one["planned"] == 40 and len(one["tokens"]) == 12
    assert one["perceived_ttft_ms"] == pytest.approx(300.0)
    assert one["upstream_ttft_ms"] == pytest.approx(60.0)
    assert one["tokens_per_burst"] == pytest.approx(1.0)  # pieces 20 ms apart: no bursts
    assert one["largest_gap_ms"] == pytest.approx(20.0)
    assert (one["finish_reason"], one["saw_done"]) == (None, False)


def test_tokens_made_after_the_client_left_are_drawn_but_in_no_burst() -> None:
    """abandon-no-abort: 20 tokens shown 20 ms apart, then the upstream went on to 300
    for nobody. The staircase shows all 300; tokens per burst counts the 20."""
    made = [{**LEDGER[0], "token_times": [100.06 + 0.02 * n for n in range(300)],
             "planned_tokens": 300, "wasted_tokens": 280}]  # fmt: skip
    left = {"results": [{**RESULT["results"][0], "chunks": [[100.07 + 0.02 * n, "tok"]
            for n in range(20)], "ended_at": 100.47, "abandoned": True}]}  # fmt: skip
    one = timeline_data("abandon-no-abort", "raw", [TAG], made, left, [], ["abandoned"])
    request = one["requests"][0]
    assert len(request["tokens"]) == 300 and len(request["bursts"]) == 20
    assert request["tokens_per_burst"] == pytest.approx(1.0)


def test_the_key_numbers_name_ttft_against_the_upstream_planned_tokens_and_the_end() -> None:
    assert key_numbers(request()) == [
        "TTFT 300 ms (upstream 60 ms)",
        "tokens 12 of 40 planned, 12 pieces shown",
        "tokens/burst 1.0 (12 bursts)",
        "largest gap 20 ms",
        "end: no finish_reason, no [DONE]",
    ]


@pytest.mark.parametrize(
    ("fields", "label", "proper"),
    [
        ({"finish_reason": "stop", "saw_done": True}, "finish_reason stop + [DONE]", True),
        ({"finish_reason": "length", "saw_done": False}, "finish_reason length, no [DONE]", True),
        ({"finish_reason": None, "saw_done": True}, "[DONE] without finish_reason", False),
        ({"finish_reason": None, "saw_done": None}, "no finish_reason, no [DONE]", False),
        ({"error": "ReadError: peer reset"}, "error: ReadError: peer reset", True),
    ],
)
def test_the_end_of_stream_marker_says_whether_the_stream_ended_properly(
    fields: dict[str, Any], label: str, proper: bool
) -> None:
    assert end_of_stream(fields) == (label, proper)


def test_decisions_closer_than_a_label_share_a_number_and_the_key_counts_them() -> None:
    faults = [[0.100, "slicer:sliced"], [0.104, "slicer:sliced"], [0.105, "cut:cut"],
              [0.200, "slicer:sliced"]]  # fmt: skip
    marks = fault_marks(faults, lambda t: t * 1000, label_width=10)  # 1 px per ms
    assert [mark.number for mark in marks] == [1, 2]
    assert [len(mark.decisions) for mark in marks] == [3, 1]
    unit = TimeUnit.for_span(0.3)
    assert marks[0].key(unit) == "1: 100-105 ms slicer:sliced x2, cut:cut"
    assert marks[1].key(unit) == "2: 200 ms slicer:sliced"
    assert TimeUnit.for_span(7.0).text(2.5) == "2.50 s"


def overlapping(boxes: list[Any]) -> list[tuple[Any, Any]]:
    return [(a, b) for a, b in itertools.combinations(boxes, 2) if a.overlaps(b)]


def test_png_fault_labels_do_not_overlap_in_matplotlibs_text_extents() -> None:
    figure = draw(data())
    renderer = figure.canvas.get_renderer()
    labels = [text for text in figure.findobj() if getattr(text, "get_gid", None)
              and text.get_gid() == FAULT_LABEL_GID]  # fmt: skip
    assert len(labels) >= 3  # the dense run is still labelled, not dropped
    boxes = [label.get_window_extent(renderer) for label in labels]
    assert not overlapping(boxes)
    # every decision is in the key beside the panel, none lost in the merging
    side = next(
        t.get_text() for t in figure.findobj() if "faults:" in str(getattr(t, "get_text", str)())
    )
    assert "slicer:sliced x" in side and "cut:cut" in side
    numbers = sorted(int(label.get_text()) for label in labels)
    assert numbers == list(range(1, len(labels) + 1))


def test_png_has_labelled_axes_ticks_planned_line_markers_and_the_scenario_on_top() -> None:
    figure = draw(data())
    (ax,) = figure.axes
    assert ax.get_xlabel() == "time since the request started (ms)"
    assert ax.get_ylabel() == "tokens / pieces"
    figure.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()][:3] == ["0", "100", "200"]
    assert {t.get_text() for t in ax.get_yticklabels()} >= {"0", "40"}
    texts = [t.get_text() for t in figure.texts]
    assert "clean-close / openai · seed 32" in texts
    assert any(DESCRIPTION[:40] in text for text in texts)
    horizontal = [line for line in ax.get_lines() if list(line.get_ydata()) == [40, 40]]
    assert horizontal, "the planned length (40 tokens) is drawn"
    # the client's TTFT at 300 ms and the end at 600 ms (red: no proper end)
    verticals = {(round(float(line.get_xdata()[0]), 3), line.get_color()) for line in ax.get_lines()
                 if len(set(line.get_xdata())) == 1 and line.get_xdata()[0] != 0}  # fmt: skip
    assert (0.3, "#2ca02c") in verticals and (0.6, "#c62828") in verticals


def test_a_long_description_is_cut_with_an_ellipsis_and_many_panels_stay_bounded(
    tmp_path: Path,
) -> None:
    long = data()
    long["description"] = "word " * 400
    long["requests"] = long["requests"] * 12
    figure = draw(long)
    assert len(figure.axes) == 8  # MAX_PANELS
    (description,) = [t.get_text() for t in figure.texts if t.get_text().startswith("word")]
    assert description.count("\n") == 3 and description.endswith("...")
    path = write_png(long, tmp_path / "many.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


SVG = "{http://www.w3.org/2000/svg}"


def test_the_svg_has_axes_ticks_planned_line_markers_and_fault_numbers_apart() -> None:
    root = ElementTree.fromstring(svg(request()))
    texts = list(root.iter(f"{SVG}text"))
    ticks = [t.text for t in texts if t.get("class") == "tick"]
    assert ticks[:4] == ["0", "200", "400", "600"] and "40" in ticks  # x in ms, y in tokens
    assert any(t.text == "time since the request started (ms)" for t in texts)
    assert any(t.text == "tokens / pieces" for t in texts)
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert "planned 40 tokens" in titles
    assert "client TTFT 300 ms" in titles
    assert "end of stream: no finish_reason, no [DONE]" in titles
    labels = [t for t in texts if t.get("class") == "fault-label"]
    assert len(labels) == len(svg_fault_marks(request())) >= 3
    # each number starts after the previous one's widest possible end (6.5 px a digit)
    starts = sorted(float(t.get("x", 0)) for t in labels)
    width = 6.5 * len(str(len(labels)))
    assert all(b - a >= width for a, b in itertools.pairwise(starts))


def test_the_header_names_the_seed_each_scenario_ran_with() -> None:
    scenarios = [{"seed": 3}, {"seed": 5}]
    assert (
        seed_line({"run": {"seed": 7}, "scenarios": scenarios}) == "seed 7 (--seed, every scenario)"
    )
    assert seed_line({"run": {"seed": None}, "scenarios": [{"seed": 3}]}) == "seed 3"
    assert (
        seed_line({"run": {"seed": None}, "scenarios": scenarios})
        == "seeds: each scenario's own (seed column)"
    )
    assert seed_line({"run": {}, "scenarios": []}) == "seed: none recorded"


def document() -> dict[str, Any]:
    result = {
        "client": "openai",
        "verdicts": {"requests": ["silent_truncation"], "checks": {}},
        "requests": [{"verdict": "silent_truncation", "attempts": 1}],
        "metrics": {"client.silent_truncations": 1},
        "checks": [],
    }
    return {
        "middlebox": "0",
        "python": "3",
        "run": {"seed": None},
        "passed": True,
        "scenarios": [
            {"name": "clean-close", "file": "c.yaml", "seed": 32, "description": DESCRIPTION,
             "results": [result]},
            {"name": "other", "file": "o.yaml", "seed": 5, "results": []},
        ],
    }  # fmt: skip


def page() -> str:
    return render(document(), {("clean-close", "openai"): data()})


def test_report_html_shows_the_seeds_and_the_numbers_and_fault_key_beside_each_timeline() -> None:
    html = page()
    assert "seed None" not in html and "seeds: each scenario&#x27;s own (seed column)" in html
    assert "<th>seed</th>" in html and "<td>32</td>" in html and "<td>5</td>" in html
    assert '<div class="timeline-row"><svg' in html
    assert "<li>TTFT 300 ms (upstream 60 ms)</li>" in html
    assert "<li>tokens 12 of 40 planned, 12 pieces shown</li>" in html
    assert (
        '<ol class="faults"><li>1: 200-214 ms slicer:sliced x8</li>' in html
        and "cut:cut</li>" in html
    )
    assert f'<p class="description">{DESCRIPTION}</p>' in html


def test_the_run_summary_line_names_report_html(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from middlebox.cli import run as run_command
    from middlebox.cli.main import main
    from middlebox.run import suite
    from middlebox.run.outcome import SuiteOutcome

    monkeypatch.setattr(suite, "run_suite", lambda *a, **k: SuiteOutcome([], None, []))
    # the scorecard has its own tests; this one is about the line after it
    monkeypatch.setattr(run_command, "show_scorecard", lambda document: None)
    (tmp_path / "s.yaml").write_text("name: s\n")
    done = CliRunner().invoke(main, ["run", str(tmp_path / "s.yaml"), "--report", "out"])
    assert done.exit_code == 0, done.output
    assert "reports: out/report.html, out/report.json, out/junit.xml" in done.output


# ------------------------------------------------------------ headless Chromium

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(target: Path, shot: Path, size: tuple[int, int]) -> None:
    subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--screenshot={shot}", f"--window-size={size[0]},{size[1]}", target.as_uri()],
        capture_output=True, text=True, timeout=60, preexec_fn=without_priority_raise,
    )  # fmt: skip


def red_columns(image: Any, box: tuple[int, int, int, int]) -> set[int]:
    """x positions in `box` holding a saturated red pixel (fault markers)."""
    pixels = image.convert("RGB").crop(box)
    return {
        x
        for x in range(pixels.width)
        for y in range(pixels.height)
        if (lambda r, g, b: r > 180 and g < 90 and b < 90)(*pixels.getpixel((x, y)))
    }


@needs(CHROMIUM, "Chromium")
def test_chromium_renders_the_timeline_png_and_report_html_with_their_markers(
    tmp_path: Path,
) -> None:
    from PIL import Image

    png = write_png(data(), tmp_path / "runs" / "t.png")
    with Image.open(png) as drawn:
        size = drawn.size
    assert size[0] == 864 and size[1] > 250  # 12 in wide at 72 dpi
    shot = tmp_path / "png-shot.png"
    screenshot(png, shot, size)
    with Image.open(shot) as seen:
        assert seen.size == size
        colours = seen.convert("RGB").getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 50  # a drawing, not a blank or an error page
        # the red fault markers in the plot's left two thirds, where the panel is
        assert len(red_columns(seen, (0, 0, size[0] * 2 // 3, size[1]))) >= 5

    report = tmp_path / "report.html"
    report.write_text(page(), encoding="utf-8")
    shot = tmp_path / "html-shot.png"
    screenshot(report, shot, (1200, 1400))
    with Image.open(shot) as seen:
        assert seen.size == (1200, 1400)
        assert len(seen.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50
        assert red_columns(seen, (0, 0, 1200, 1400))  # fault markers and the red end line
    dom = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
         report.as_uri()],
        capture_output=True, text=True, timeout=60, preexec_fn=without_priority_raise,
    ).stdout  # fmt: skip
    assert 'class="timeline-row"' in dom and 'class="fault-label"' in dom


def test_write_timelines_puts_the_description_and_seed_in_each_runs_json_and_png(
    tmp_path: Path,
) -> None:
    import json

    from middlebox.report.html_page import write_timelines

    run = tmp_path / "runs" / "00-clean-close"
    run.mkdir(parents=True)
    (run / "ledger.json").write_text(
        json.dumps(LEDGER).replace(TAG, "[middlebox clean-close/openai/0]")
    )
    (run / "openai.result.json").write_text(json.dumps(RESULT))
    written = write_timelines(document(), tmp_path)
    saved = json.loads((run / "openai.timeline.json").read_text())
    assert saved == json.loads(json.dumps(written[("clean-close", "openai")]))
    assert (saved["description"], saved["seed"]) == (DESCRIPTION, 32)
    assert saved["requests"][0]["planned"] == 40  # the ledger was found by the request's tag
    assert (run / "openai.timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_a_result_the_scorer_refused_is_not_drawn_and_breaks_no_timeline(tmp_path: Path) -> None:
    """A `--client-cmd` result that breaks the contract (`[1,2]`) is its run's problem:
    the timeline draws what was generated and no shown text, as for a client that wrote none."""
    import json

    from middlebox.report.html_page import write_timelines

    run = tmp_path / "runs" / "00-clean-close"
    run.mkdir(parents=True)
    (run / "openai.result.json").write_text("[1, 2]")
    refused = document()
    for request in refused["scenarios"][0]["results"][0]["requests"]:
        request["verdict"] = "no_result"
    refused["scenarios"][0]["results"][0]["verdicts"]["requests"] = ["no_result"]
    written = write_timelines(refused, tmp_path)
    assert [r["shown"] for r in written[("clean-close", "openai")]["requests"]] == [[]]
    # the same file under a verdict the scorer read it for would be drawn
    (run / "openai.result.json").write_text(json.dumps(RESULT))
    drawn = write_timelines(document(), tmp_path)[("clean-close", "openai")]["requests"]
    assert drawn[0]["shown"]
