"""`browser`: a web page reading the stream with `fetch()`, in headless Chromium.

A chat UI in a browser cannot use `EventSource` for the request itself (it only GETs),
so it POSTs with `fetch()` and reads `response.body` through a `TextDecoderStream`,
splitting lines and showing each `data:` delta, stopping at `[DONE]`: the pattern of
most web chat clients.

`browser-eventsource` (`--eventsource`) is the other web pattern, for a resumable
server: POST to start the generation, take the stream id from `X-Stream-Id`, drop that
response and follow `GET /v1/streams/{id}` with an `EventSource`, whose built-in
reconnect sends `Last-Event-ID` (the HTML living standard's reconnection, after its
default ~3 s retry), so the browser itself resumes after a network change. A server
that is not resumable (no `X-Stream-Id`) is an error for this page, and more than
`MAX_RECONNECTS` reconnects in a row without an event give up.
What that gives is Chromium's own network stack: at most 6 HTTP/1.1 connections per
host (more requests queue in the browser), no read timeout, `TypeError: network error`
on an RST or a cut chunked body, a silent end on a clean close without `[DONE]`, an
`AbortController` that closes the connection when the user leaves. A non-2xx status or
an in-band `{"error": ...}` frame is shown as an error, as the page checks both.

The Python side is a driver: a loopback control server serves the page, sends it one
command per request over an `EventSource` (the contract's concurrency and start times
stay in `contract.run_workload`), and receives each request's result, with display
times taken in the page, by POST. Chromium runs with the flags below plus
`--disable-web-security`, because the page's origin (the control server) differs from
the proxy's and neither vLLM nor the emulator answers CORS preflights; this client
models the browser's streaming, not its CORS policy.

Chromium raises some of its own threads' priority where the OS lets it (its display-
critical threads, the compositor and child IO threads, to nice -8, and the rest back to 0,
whatever nice it was started at: base/threading's Linux thread types), which a root
process may (CAP_SYS_NICE). In CI that is every run: Chromium then outranks the emulator
and the proxy it is measured against, a starved emulator catches up by merging several
tokens into one SSE frame (as vLLM does when its API server lags), and a scenario's
"after 12 events" trigger finds fewer than 12 events in the whole answer and never fires
(clean-close-without-done's cut, seen in CI; reproduced by stopping the emulator for
0.5 s). So Chromium starts without CAP_SYS_NICE in its bounding set and runs at its
driver's priority (`without_priority_raise`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

from aiohttp import web

from middlebox.clients import chromium_path
from middlebox.clients.contract import ClientEnv, Handler, Recorder, RequestSpec, run_client

READY_TIMEOUT_S = 60.0
MAX_RECONNECTS = 5

PR_CAPBSET_DROP = 24  # <linux/prctl.h>
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when its parent dies
CAP_SYS_NICE = 23  # <linux/capability.h>: raise a priority (a nice below the current)

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-web-security",
    "--disable-dev-shm-usage",  # containers often have a 64 MiB /dev/shm
]

PAGE = """<!doctype html>
<meta charset="utf-8">
<title>middlebox browser client</title>
<script>
const CONFIG = __CONFIG__;
const now = () => (performance.timeOrigin + performance.now()) / 1000;
class Leave extends Error {}

function pieceOf(choice) {
  if (choice.delta) return choice.delta.content || "";
  return choice.text || "";
}

function followEventSource(id, r, show) {
  // EventSource reconnects by itself and sends Last-Event-ID; we only bound it.
  return new Promise((resolve, reject) => {
    const source = new EventSource(CONFIG.streams + encodeURIComponent(id));
    let failures = 0;
    source.onopen = () => { r.attempts += 1; };
    source.onmessage = (event) => {
      failures = 0;
      if (event.data === "[DONE]") {
        r.saw_done = true;
        source.close();
        resolve();
        return;
      }
      try {
        show(JSON.parse(event.data));
      } catch (e) {
        source.close();
        if (e instanceof Leave) resolve(); else reject(e);
      }
    };
    source.onerror = () => {
      failures += 1;
      if (source.readyState === EventSource.CLOSED || failures > CONFIG.max_reconnects) {
        source.close();
        reject(new Error("EventSource gave up after " + failures + " failed connection(s)"));
      } else {
        r.resumes += 1;
      }
    };
  });
}

async function run(spec) {
  const r = {index: spec.index, chunks: [], finish_reason: null, usage: null, error: null,
             saw_done: false, abandoned: false, attempts: 0, resumes: 0};
  const controller = new AbortController();
  const leave = () => { r.abandoned = true; controller.abort(); };
  const timer = spec.abandon_after_seconds == null ? null
    : setTimeout(leave, spec.abandon_after_seconds * 1000);
  const show = (obj) => {
    if (obj.error) throw new Error(obj.error.message || JSON.stringify(obj.error));
    if (obj.usage) r.usage = obj.usage;
    for (const choice of obj.choices || []) {
      if ((choice.index || 0) !== 0) continue;
      if (choice.finish_reason) r.finish_reason = choice.finish_reason;
      const piece = choice.message ? (choice.message.content || "") : pieceOf(choice);
      if (!piece) continue;
      r.chunks.push([now(), piece]);
      if (spec.abandon_after_tokens != null && r.chunks.length >= spec.abandon_after_tokens) {
        leave();
        throw new Leave();
      }
    }
  };
  try {
    const response = await fetch(CONFIG.url[spec.endpoint], {
      method: "POST",
      headers: {"Content-Type": "application/json", "Authorization": "Bearer " + CONFIG.key},
      body: JSON.stringify(spec.body),
      signal: controller.signal,
    });
    if (!response.ok) {
      throw new Error("HTTP " + response.status + ": " + (await response.text()).slice(0, 300));
    }
    if (CONFIG.eventsource && spec.body.stream) {
      const id = response.headers.get("x-stream-id");
      controller.abort();  // the EventSource reads the stream; a resumable server keeps going
      if (!id) throw new Error("the server offers no resumable stream (no X-Stream-Id)");
      await followEventSource(id, r, show);
    } else if (!spec.body.stream) {
      show(await response.json());
    } else {
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      reading: for (;;) {
        const {value, done} = await reader.read();
        if (done) break;
        buffer += value;
        const lines = buffer.split(/\\r\\n|\\r|\\n/);
        buffer = lines.pop();
        for (const line of lines) {
          if (!line.startsWith("data:")) continue;
          const data = line.slice(5).trim();
          if (data === "[DONE]") {
            r.saw_done = true;
            await reader.cancel();
            break reading;
          }
          show(JSON.parse(data));
        }
      }
    }
  } catch (e) {
    if (!r.abandoned) r.error = e.name + ": " + e.message;
  } finally {
    if (timer !== null) clearTimeout(timer);
  }
  if (!CONFIG.eventsource || !spec.body.stream) r.attempts = 1;
  await fetch("/result", {method: "POST", body: JSON.stringify(r)});
}

const control = new EventSource("/control");
control.onmessage = (event) => { run(JSON.parse(event.data)); };
</script>
"""


class _Driver:
    """The control server's state: commands out to the page, results back."""

    def __init__(self, env: ClientEnv, eventsource: bool = False) -> None:
        config = {
            "url": {"chat": env.url("chat"), "completions": env.url("completions")},
            "streams": env.base_url.rstrip("/") + "/streams/",  # GET /v1/streams/{id}
            "key": env.api_key,
            "eventsource": eventsource,
            "max_reconnects": MAX_RECONNECTS,
        }
        self.page = PAGE.replace("__CONFIG__", json.dumps(config))
        self.commands: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.ready = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self.serve_page)
        app.router.add_get("/control", self.control)
        app.router.add_post("/result", self.result)
        return app

    async def serve_page(self, request: web.Request) -> web.Response:
        return web.Response(text=self.page, content_type="text/html")

    async def control(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
        )
        await response.prepare(request)
        self.ready.set()
        while (command := await self.commands.get()) is not None:
            await response.write(b"data: " + json.dumps(command).encode() + b"\n\n")
        return response

    async def result(self, request: web.Request) -> web.Response:
        result = await request.json()
        future = self.pending.pop(int(result["index"]), None)
        if future is not None and not future.done():
            future.set_result(result)
        return web.Response(text="ok")

    async def handle(self, spec: RequestSpec, rec: Recorder) -> None:
        future = asyncio.get_running_loop().create_future()
        self.pending[spec.index] = future
        await self.commands.put(
            {
                "index": spec.index,
                "endpoint": spec.endpoint,
                "body": spec.body,
                "abandon_after_tokens": spec.abandon_after_tokens,
                "abandon_after_seconds": spec.abandon_after_seconds,
            }
        )
        result = await future
        rec.attempts += max(int(result.get("attempts") or 0), 1)
        rec.resumes += int(result.get("resumes") or 0)
        for when, piece in result["chunks"]:
            rec.shown_at(float(when), piece)
        rec.finish_reason = result["finish_reason"]
        rec.usage = result["usage"]
        rec.error = result["error"]
        rec.saw_done = bool(result["saw_done"])
        rec.abandoned = bool(result["abandoned"])


def _prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux's libc: nothing to drop
        return None


_PRCTL = _prctl()


def without_priority_raise() -> None:
    """Drop CAP_SYS_NICE from this thread's bounding set, so a program it execs from now on
    (Chromium, even as root) cannot raise a thread above the priority it inherits
    (setpriority(2): a nice below the current one needs CAP_SYS_NICE or RLIMIT_NICE, whose
    default allows none). This process keeps what it holds; it only starts Chromium. Where
    the drop is not permitted (no CAP_SETPCAP) an exec could not have gained CAP_SYS_NICE
    from a root's bounding set either, and nothing changes."""
    if _PRCTL is not None:
        _PRCTL(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0)


def dies_with(parent: int) -> None:
    """Between fork and exec: SIGTERM when `parent` (this client) dies, a SIGKILL included,
    or at once if it already has (what `middlebox.shell.lifetime.die_with_parent` does for
    the run's children; a client imports no room but core)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)


def start_chromium(binary: str, profile: str, url: str) -> subprocess.Popen[bytes]:
    """Headless Chromium on `url` with its own profile, at this process's priority; it
    stops when this client does, however the client ends. Called on the loop's thread, which
    lives as long as the client (the parent-death signal follows the forking thread)."""
    without_priority_raise()  # the calling thread forks it: its bounding set is the one
    return subprocess.Popen(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", url],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=partial(dies_with, os.getpid()),
    )


@asynccontextmanager
async def session(env: ClientEnv, eventsource: bool = False) -> AsyncIterator[Handler]:
    binary = chromium_path()
    if binary is None:
        raise FileNotFoundError("chromium is not installed (Debian package `chromium`)")
    driver = _Driver(env, eventsource)
    runner = web.AppRunner(driver.app(), handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    # A SIGTERM from the runner must still end Chromium: cancel, so `finally` runs.
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if main is not None:
        loop.add_signal_handler(signal.SIGTERM, main.cancel)
    # Chromium's helper processes can still be writing the profile when the main one has
    # exited: a failed removal must not cost the run its result (seen: "Directory not
    # empty: 'Default'", and the client wrote no result).
    with tempfile.TemporaryDirectory(
        prefix="middlebox-chromium-", ignore_cleanup_errors=True
    ) as profile:
        # Popen returns once Chromium is forked; the loop is not held while it runs.
        browser = start_chromium(binary, profile, f"http://127.0.0.1:{port}/")
        try:
            async with asyncio.timeout(READY_TIMEOUT_S):
                await driver.ready.wait()
            yield driver.handle
        finally:
            driver.commands.put_nowait(None)  # ends the control stream, so cleanup is quick
            browser.terminate()
            try:
                await asyncio.to_thread(browser.wait, 5.0)
            except subprocess.TimeoutExpired:
                browser.kill()
                await asyncio.to_thread(browser.wait)
            loop.remove_signal_handler(signal.SIGTERM)
            with contextlib.suppress(Exception):
                await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    if "--eventsource" in (sys.argv[1:] if argv is None else argv):
        return run_client(
            "browser-eventsource", partial(session, eventsource=True), self_timed=True
        )
    return run_client("browser", session, self_timed=True)


if __name__ == "__main__":
    raise SystemExit(main())
