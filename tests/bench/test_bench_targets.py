"""The bench's verdicts: the targets computed from one run's rows (ratios against
baselines of the same run), its journal table, and the scenarios it writes validating.

No processes run here: the rows are literal, as the suite would have measured them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.render import journal_cost, render
from bench.suite import Bench, Settings, saturation, targets
from middlebox.compose import load


def stream_row(path: str, streams: int, p99: float, cpu: float, kib: float) -> dict[str, Any]:
    return {
        "path": path,
        "streams": streams,
        "p50_ms": 0.2,
        "p99_ms": p99,
        "added_p50_ms": 0.1,
        "added_p99_ms": p99 - 0.5,
        "proxy_cpu_us_per_frame": cpu,
        "rss_kib_per_stream": kib,
        "frames": streams * 20 * 3,
        "window_s": 3.0,
        "connect_errors": 0,
        "closed_early": 0,
    }


def results() -> dict[str, Any]:
    stream = [
        stream_row("middlebox", 1000, 1.2, 30.0, 15.0),
        stream_row("nginx", 1000, 1.0, 25.0, 14.0),
        stream_row("middlebox_faults", 1000, 9.0, 75.0, 30.0),
        stream_row("middlebox_faults", 2000, 30.0, 70.0, 31.0),
        stream_row("middlebox_preset", 1000, 900.0, 50.0, 40.0),
        stream_row("middlebox_journal", 1000, 1.4, 36.0, 18.0),
        stream_row("middlebox", 2000, 3.0, 28.0, 15.0),
    ]
    out: dict[str, Any] = {
        "machine": {
            "date": "today",
            "cores": 2,
            "cpu": "x",
            "os": "Debian",
            "kernel": "6",
            "load_average_at_start": 0.5,
        },
        "versions": {"middlebox": "0", "python": "3.11", "trio": "0", "nginx": "n", "gcc": "g"},
        "settings": {"warmup_s": 1.0, "measure_s": 3.0, "faults": ["latency"]},
        "duration_s": 10.0,
        "paths": {
            "middlebox": "middlebox pass-through, 1 worker",
            "middlebox_faults": "middlebox, 3 faults",
            "middlebox_preset": "middlebox, nginx-default preset",
            "middlebox_journal": "middlebox pass-through --journal",
            "nginx": "nginx",
            "nginx_nokeepalive": "nginx, no upstream keepalive",
        },
        "stream": stream,
        "bulk_64k": [
            {"path": "middlebox_faults", "mb_per_s": 300.0},
            {"path": "nginx", "mb_per_s": 400.0},
        ],
        "bulk_big": [],
        "connect": [
            {"path": "middlebox", "per_s": 6000.0, "p50_ms": 2.0, "p99_ms": 5.0},
            {"path": "nginx_nokeepalive", "per_s": 10000.0, "p50_ms": 1.2, "p99_ms": 2.0},
        ],
    }
    out["saturation"] = saturation(stream)
    return out


def verdicts(found: list[dict[str, Any]]) -> dict[str, tuple[str, bool]]:
    return {t["target"]: (t["measured"], t["met"]) for t in found}


def test_each_of_issue_16s_targets_is_judged_by_its_ratio_within_the_run() -> None:
    found = verdicts(targets(results()))
    assert found["three-fault path holds 2000 streams, one worker (added p99 < 5 ms)"] == (
        "0 streams",
        False,
    )
    # at the largest count both paths ran (2000): 70 against 28 us
    assert found["three-fault path: CPU per frame <= 2x pass-through's (2000 streams)"] == (
        "70.0 vs 28.0 µs/frame = 2.50x",
        False,
    )
    assert found["nginx-default preset path: CPU per frame <= 2x pass-through's (1000 streams)"][1]
    assert found["pass-through CPU per frame <= 1.3x nginx's (1000 streams)"] == (
        "30.0 vs 25.0 µs/frame = 1.20x",
        True,
    )
    assert found["new connections/s >= half of nginx's without upstream keepalive"] == (
        "6000.0 vs 10000.0 /s = 0.60x",
        True,
    )
    assert found["setup + response p50 <= 2x nginx's without upstream keepalive"] == (
        "2.0 vs 1.2 ms = 1.67x",
        True,
    )
    assert found["64 KiB responses through the three-fault path >= nginx's MB/s"] == (
        "300.0 vs 400.0 MB/s = 0.75x",
        False,
    )
    memory = found["memory per open stream < 32 KiB (middlebox, 3 faults)"]
    assert memory == ("30.0 KiB at 1000 streams", True)
    assert found["pass-through adds < 1 ms p99 at 1000 streams"] == ("0.70 ms", True)


def test_the_journal_table_sets_each_path_beside_itself_with_journal() -> None:
    lines = journal_cost(results())
    assert "| 1000 | middlebox pass-through, 1 worker | 30.0 / 36.0 | 15.0 / 18.0 |" in lines
    assert len([line for line in lines if line.startswith("| 1000")]) == 1  # no faults+journal row


def test_the_rendered_table_lists_connection_setup_for_paths_without_bulk_rows() -> None:
    text = render(results() | {"targets": targets(results())})
    assert "| nginx, no upstream keepalive | n/a | n/a | 10000 | 1.20 / 2.00 |" in text
    assert "### The journal's cost" in text


def test_the_scenarios_the_bench_writes_validate(tmp_path: Path) -> None:
    bench = Bench(tmp_path, Settings(), log=lambda _line: None)
    bench.write_scenario()
    three = load(bench.scenario)
    assert [spec.name for spec in three.path] == ["latency", "set_header", "idle_reaper"]
    preset = load(bench.preset_scenario)
    assert "idle_reaper" in [spec.name for spec in preset.path]


def test_the_consoles_page_is_judged_against_the_console_without_one() -> None:
    page_cost = "a live console page costs <= 10% CPU per frame"
    rate = "the console's feed sends <= 10 updates/s (500 streams)"
    assert not any(t.startswith(page_cost) for t in verdicts(targets(results())))  # not run

    def judged(page_cpu: float, updates: float) -> dict[str, tuple[str, bool]]:
        found = results()
        page = stream_row("middlebox_ui", 500, 2.0, page_cpu, 30.0)
        page.update(feed_updates_per_s=updates, feed_kib_per_s=200.0)
        found["stream"] += [stream_row("middlebox_ui_idle", 500, 2.0, 40.0, 30.0), page]
        return verdicts(targets(found))

    cheap = judged(43.0, 9.5)
    (name,) = [t for t in cheap if t.startswith(page_cost)]
    assert cheap[name] == ("43.0 vs 40.0 µs/frame = 1.07x", True)
    assert cheap[rate] == ("9.5 updates/s, 200 KiB/s", True)
    costly = judged(46.0, 12.0)
    assert costly[name] == ("46.0 vs 40.0 µs/frame = 1.15x", False)
    assert costly[rate][1] is False
