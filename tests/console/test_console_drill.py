"""`middlebox drill start` with its console (real processes on 127.0.0.1, bounded in time): the
page shows the drill's symptoms and its hints one at a time, a connection the drill's fault
cuts shows as cut within a second of the client seeing it, and a `drill check` grade
written meanwhile appears on the page."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import aiohttp
import pytest

from middlebox.clients import chromium_path
from middlebox.run.drills import console_state, live_banner, save_result, start
from tests.console.chromium import chromium_page
from tests.harness import needs

pytestmark = pytest.mark.e2e

CUT_SHOWN_WITHIN = 1.0  # seconds, the acceptance bound: the feed updates every 0.1 s

needs_chromium = needs(chromium_path(), "chromium")


async def cut_stream(base_url: str, model: str) -> float:
    """One streamed answer the drill's fault resets; when (wall clock) the client saw it end."""
    body = {"model": model, "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "Tell me a long story."}]}  # fmt: skip
    async with aiohttp.ClientSession() as session:
        try:
            async with session.post(f"{base_url}/chat/completions", json=body) as answer:
                text = await answer.text()
                assert "[DONE]" not in text
        except aiohttp.ClientError:
            pass  # the reset, as the client sees it
    return time.time()


def test_the_drill_state_reads_symptoms_hints_and_only_this_sessions_grade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    save_result("mid-stream-reset", True, [])  # an earlier session's: not shown
    before = (tmp_path / "middlebox" / "drills" / "mid-stream-reset.check.json").stat()
    os.utime(
        tmp_path / "middlebox" / "drills" / "mid-stream-reset.check.json",
        (before.st_atime - 3600, before.st_mtime - 3600),
    )
    state = console_state("mid-stream-reset")
    shown = state()
    assert shown["check"] is None
    assert "mobile networks" in shown["symptoms"][0] and len(shown["hints"]) == 3
    save_result("mid-stream-reset", False, ["raw: client.silent_truncations 1 (want 0)"])
    assert state()["check"] == "FAIL: raw: client.silent_truncations 1 (want 0)"


@needs_chromium
def test_drill_start_shows_symptoms_hints_a_cut_within_a_second_and_the_grade(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # the proxy child inherits it
    live = start("mid-stream-reset", journal=tmp_path / "journal.ndjson")
    try:
        assert live.proxy.ui_url is not None
        assert f"Console: {live.proxy.ui_url}" in live_banner(live)

        async def main() -> None:
            async with chromium_page(live.proxy.ui_url or "") as page:
                await page.wait_for(
                    "document.querySelector('#symptoms')?.textContent.includes('mobile')"
                )
                assert await page.evaluate("document.querySelectorAll('#hints li').length") == 0
                await page.evaluate("document.querySelector('#next-hint').click()")
                await page.wait_for("document.querySelectorAll('#hints li').length === 1")
                assert "journal" in await page.evaluate(
                    "document.querySelector('#hints li').textContent"
                )
                cut_at = await cut_stream(live.proxy.base_url, live.model)
                await page.wait_for(
                    "[...document.querySelectorAll('#connections .state')]"
                    ".some(s => s.textContent === 'cut')"
                )
                # when the page first drew it cut, by the page's clock (this machine's)
                shown_at = await page.evaluate("Math.min(...Object.values(window.cutShownAt))")
                assert shown_at - cut_at <= CUT_SHOWN_WITHIN
                save_result("mid-stream-reset", True, [])  # as `drill check` does
                await page.wait_for(
                    "document.querySelector('#drill-check')?.textContent.includes('PASS')"
                )

        asyncio.run(main())
    finally:
        live.stop()
