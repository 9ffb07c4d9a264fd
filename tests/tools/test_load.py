"""`middlebox load` and the Locust user: TTFT and ITL counted per content event, bounded runs."""

from __future__ import annotations

import csv
import sys
from functools import partial
from pathlib import Path

import pytest
import trio
from trio.testing import MockClock

from middlebox.tools.load import Target, event_text, percentiles, run_load
from tests.harness import proxied
from tests.tools.sse_server import GAP, TOKENS, chat_server

ROOT = Path(__file__).resolve().parents[2]


def test_only_events_that_carry_content_count_as_tokens() -> None:
    assert event_text('{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}') is None
    assert event_text('{"choices": [{"index": 0, "delta": {"content": "Hi"}}]}') == "Hi"
    assert event_text('{"choices": [{"index": 0, "text": "legacy"}]}') == "legacy"
    assert event_text("[DONE]") is None
    assert event_text("not json") is None
    assert event_text('{"choices": []}') is None


def test_a_bare_host_url_means_the_chat_completions_path() -> None:
    assert Target.parse("http://127.0.0.1:9000") == Target(
        "127.0.0.1", 9000, "/v1/chat/completions"
    )
    assert Target.parse("http://h:1/v1/completions").path == "/v1/completions"
    with pytest.raises(ValueError):
        Target.parse("https://127.0.0.1:9000")


def test_percentiles_use_the_nearest_rank_in_milliseconds() -> None:
    values = [n / 1000 for n in range(1, 101)]  # 1 ms .. 100 ms
    assert percentiles(values) == {"p50_ms": 50.0, "p90_ms": 90.0, "p99_ms": 99.0, "max_ms": 100.0}
    assert percentiles([])["p99_ms"] is None


async def test_load_through_the_proxy_counts_one_ttft_per_stream_and_one_itl_per_gap(
    autojump_clock: MockClock,
) -> None:
    with trio.fail_after(30):
        async with proxied(chat_server) as running:
            report = await run_load(
                f"http://127.0.0.1:{running.proxy_port}", 4, 0.3, ramp=1000, max_requests=40
            )
    assert report.requests > 0 and report.errors == {}
    assert report.completed == report.requests <= 40
    assert report.tokens == TOKENS * report.completed
    assert len(report.ttfts) == report.completed
    assert len(report.itls) == (TOKENS - 1) * report.completed
    summary = report.to_json()
    assert summary["ttft"]["p50_ms"] is not None and summary["itl"]["p99_ms"] is not None
    # virtual time: each gap between content events is exactly the server's pacing
    assert summary["itl"]["p50_ms"] == summary["itl"]["max_ms"] == pytest.approx(GAP * 1000)
    assert "TTFT" in report.text() and "ITL" in report.text()


async def test_load_stops_at_max_requests_and_counts_http_errors_by_status(
    autojump_clock: MockClock,
) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(
                partial(trio.serve_tcp, chat_server, 0, host="127.0.0.1")
            )
            port = listeners[0].socket.getsockname()[1]
            report = await run_load(
                f"http://127.0.0.1:{port}/v1/other", 3, 30, ramp=1000, max_requests=7
            )
            nursery.cancel_scope.cancel()
    assert report.requests == 7
    assert report.completed == 0
    assert report.errors == {"HTTP 404": 7}


@pytest.mark.e2e
async def test_a_short_headless_locust_run_reports_ttft_and_itl_as_request_metrics(
    tmp_path: Path,
) -> None:
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, chat_server, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        argv = [
            sys.executable,
            "-m",
            "locust",
            "-f",
            str(ROOT / "middlebox" / "tools" / "locustfile.py"),
            "--headless",
            "--users",
            "2",
            "--spawn-rate",
            "2",
            "--run-time",
            "3s",
            "--stop-timeout",
            "2",
            "--host",
            f"http://127.0.0.1:{port}",
            "--csv",
            str(tmp_path / "run"),
            "--only-summary",
            "--loglevel",
            "WARNING",
        ]
        with trio.fail_after(60):
            done = await trio.run_process(
                argv, cwd=ROOT, capture_stdout=True, capture_stderr=True, check=False
            )
        nursery.cancel_scope.cancel()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    with open(tmp_path / "run_stats.csv", newline="") as handle:
        rows = {(row["Type"], row["Name"]): row for row in csv.DictReader(handle)}
    ttft, itl = rows[("SSE", "TTFT")], rows[("SSE", "ITL")]
    streams = int(ttft["Request Count"])
    assert streams > 0 and int(ttft["Failure Count"]) == 0
    # Each complete stream has TOKENS content events, so TOKENS - 1 gaps; a stream cut
    # by the end of the run reports neither.
    assert int(itl["Request Count"]) == (TOKENS - 1) * streams
    assert int(rows[("POST", "chat stream (head)")]["Failure Count"]) == 0
