"""Acceptance: the console in headless Chromium. A real `middlebox proxy` with nginx's default
buffering and `--ui`, before the embedded emulator: one streamed answer shows its two lines
apart and the page names buffering; the fault removed from the page, the next answer's
lines run together. A refused edit shows the loader's problem under its field. With
MIDDLEBOX_UI_SCREENSHOTS=1 the two states are saved for docs/ui.md.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import aiohttp

from middlebox.clients import chromium_path
from tests.console.chromium import chromium_page
from tests.harness import needs
from tests.proxy_process import stop

ROOT = Path(__file__).resolve().parents[2]
START_BOUND = 60.0  # seconds: a bound for a loaded machine, not a measurement
MODEL = "middlebox/emulated-7b"

needs_chromium = needs(chromium_path(), "chromium")


def first_line(process: subprocess.Popen[str], pattern: str) -> re.Match[str]:
    assert process.stdout is not None
    deadline = time.monotonic() + START_BOUND
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r} (exit {process.poll()})")


@contextmanager
def started(*args: str) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [sys.executable, "-m", "middlebox", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        yield process
    finally:
        stop(process, bound=15)


@contextmanager
def proxy_with_console(scenario: str) -> Iterator[tuple[int, str]]:
    """The emulator and `middlebox proxy --scenario scenario --ui`: (proxy port, page URL)."""
    with started("emulate", "--port", "0") as emulator:
        upstream = first_line(emulator, r"listening on (http://\S+)").group(1)
        with started(
            "proxy", "--listen", "127.0.0.1:0", "--upstream", upstream, "--scenario",
            scenario, "--ui", "127.0.0.1:0", "--grace", "1",
        ) as proxy:  # fmt: skip
            found = first_line(proxy, r"listening on http://127\.0\.0\.1:(\d+).*console on (\S+)")
            yield int(found.group(1)), found.group(2)


async def stream_one(port: int) -> str:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about proxies."}],
        "stream": True,
        "max_tokens": 60,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as answer,
    ):
        assert answer.status == 200
        return await answer.text()


SHOWN = "document.querySelector('#stream-title').textContent"
KINDS = "document.querySelector('#words').dataset.kinds"
LAG = "parseFloat(document.querySelector('#chart').dataset.lag || 'NaN')"
FINISHED = (
    "(() => { const f = [...document.querySelectorAll('#figures dd')].map(d => d.textContent);"
    " return f.some(t => t === 'complete') && f.some(t => t.includes('client seen')); })()"
)


@needs_chromium
def test_the_page_shows_buffering_then_the_lines_together_once_the_fault_is_gone(
    tmp_path: Path,
) -> None:
    shots = ROOT / "docs" / "img" if os.environ.get("MIDDLEBOX_UI_SCREENSHOTS") else tmp_path

    pictures: dict[str, bytes] = {}

    async def main() -> None:
        with proxy_with_console("nginx-default-buffering") as (port, url):
            async with chromium_page(url) as page:
                await page.wait_for("document.querySelector('#faults [data-fault]')")
                assert "[DONE]" in await stream_one(port)
                await page.wait_for(FINISHED)
                title = await page.evaluate(SHOWN)
                assert "buffering" in (await page.evaluate(KINDS)).split(",")
                assert "buffering" in await page.evaluate(
                    "document.querySelector('#words').textContent"
                )
                assert await page.evaluate(LAG) > 0.1  # the lines apart: tokens held > 100 ms
                pictures["ui-buffering.png"] = await page.screenshot()

                # a refused edit: the loader's words under the field it came from
                await page.evaluate(
                    "document.querySelector('#fault-options-0').value = "
                    '\'{"buffer_size": "huge"}\';'
                    "document.querySelector('[data-save=\"0\"]').click()"
                )
                await page.wait_for(
                    "document.querySelector('#faults .problems').textContent"
                    ".includes('proxy_buffering.buffer_size: expected a size')"
                )
                await page.evaluate("document.querySelector('[data-remove=\"0\"]').click()")
                await page.wait_for(
                    "document.querySelector('#faults').textContent.includes('no faults')"
                )
                assert "[DONE]" in await stream_one(port)
                await page.wait_for(f"{SHOWN} !== {title!r}")
                await page.wait_for(FINISHED)
                assert await page.evaluate(KINDS) == ""
                assert await page.evaluate(LAG) < 0.05  # together
                pictures["ui-smooth.png"] = await page.screenshot()

    asyncio.run(main())
    shots.mkdir(parents=True, exist_ok=True)
    for name, png in pictures.items():
        (shots / name).write_bytes(png)
