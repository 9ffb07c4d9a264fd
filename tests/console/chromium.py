"""A headless Chromium driven over the DevTools protocol (aiohttp's WebSocket client): open a
page, evaluate JavaScript in it, take a screenshot. Enough for the console's acceptance
test; the built-in browser client (middlebox.clients.browser) starts Chromium the same way."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

from middlebox.clients import chromium_path
from middlebox.clients.browser import CHROMIUM_FLAGS

START_TIMEOUT = 30.0


class Page:
    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self.socket = socket
        self.ids = itertools.count(1)

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        ident = next(self.ids)
        await self.socket.send_json({"id": ident, "method": method, "params": params})
        while True:
            message = json.loads((await self.socket.receive()).data)
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return dict(message.get("result", {}))

    async def evaluate(self, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, bound: float = 20.0) -> Any:
        """The value of `expression` once it is truthy."""
        value = None
        try:
            async with asyncio.timeout(bound):
                while True:
                    value = await self.evaluate(f"Boolean({expression})")
                    if value:
                        return value
                    await asyncio.sleep(0.05)
        except TimeoutError:
            where = await self.evaluate("location.href + ' ' + document.body.innerText")
            raise AssertionError(f"{expression} stayed {value!r} on {where}") from None

    async def screenshot(self) -> bytes:
        """The page as a PNG."""
        shot = await self.call("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])


@contextlib.asynccontextmanager
async def chromium_page(url: str, width: int = 1000, height: int = 900) -> AsyncIterator[Page]:
    binary = chromium_path()
    if binary is None:
        raise RuntimeError("chromium is not installed")
    # Chromium's helper processes can still be writing the profile when the main one has
    # exited (as the browser client found): a failed removal must not fail the test.
    with tempfile.TemporaryDirectory(
        prefix="middlebox-console-", ignore_cleanup_errors=True
    ) as profile:
        process = await asyncio.create_subprocess_exec(
            *[
                binary,
                *CHROMIUM_FLAGS,
                "--remote-debugging-port=0",
                f"--window-size={width},{height}",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            async with asyncio.timeout(START_TIMEOUT):
                while not port_file.exists() or not port_file.read_text().strip():
                    await asyncio.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            async with aiohttp.ClientSession() as session:
                async with session.get(f"http://127.0.0.1:{port}/json/list") as answer:
                    targets = await answer.json()
                target = next(t for t in targets if t["type"] == "page")
                async with session.ws_connect(
                    target["webSocketDebuggerUrl"], max_msg_size=64 * 1024 * 1024
                ) as socket:
                    page = Page(socket)
                    await page.call("Page.enable")
                    await page.call("Page.navigate", url=url)
                    yield page
        finally:
            process.terminate()
            try:
                async with asyncio.timeout(10):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()
