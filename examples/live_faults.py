"""A fault added to a running proxy and removed again, from Python (docs/python-api.md).

    python examples/live_faults.py

Starts the bundled vLLM emulator and `middlebox proxy --control` in front of it (both on
free loopback ports), streams one chat completion through the proxy, adds a `cut` after
5 tokens with the control API, streams again and sees the stream end without `[DONE]`,
removes the fault, streams clean again, and reads the counters. It prints what it saw
and exits 1 if the fault did not do what it says (tests/run/test_live_example.py runs it).
Against a proxy you already run: `python examples/live_faults.py --proxy
http://127.0.0.1:9000 --control http://127.0.0.1:9001`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from middlebox.run.live import ControlClient, start_proxy
from middlebox.run.processes import EmulatorProcess
from middlebox.run.upstream import UpstreamClient

MAX_TOKENS = 20
CUT_AFTER = 5


def stream(proxy_url: str, model: str) -> tuple[str, int, bool]:
    """One streaming chat completion through the proxy: (text, tokens, saw [DONE])."""
    url = urlsplit(proxy_url)
    connection = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=30)
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "stream": True,
        "max_tokens": MAX_TOKENS,
    }
    headers = {"Content-Type": "application/json"}
    text, tokens, done = "", 0, False
    try:
        connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
        for raw in connection.getresponse():
            line = raw.strip()
            if line == b"data: [DONE]":
                done = True
            elif line.startswith(b"data: "):
                for choice in json.loads(line[6:]).get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        text, tokens = text + piece, tokens + 1
    except (http.client.HTTPException, OSError):
        pass  # a cut may end the stream as a reset: what was shown is what counts
    finally:
        connection.close()
    return text, tokens, done


def demonstrate(proxy_url: str, control: ControlClient, model: str) -> bool:
    """The walk-through; True when each step showed what it should."""
    control.reset_counters()
    text, tokens, done = stream(proxy_url, model)
    print(f"clean:      {tokens} tokens, [DONE] {done}")
    ok = done and tokens > CUT_AFTER

    with control.fault("cut", after="tokens", count=CUT_AFTER, end="fin") as index:
        print(f"added:      {control.faults()[index]}")
        text, tokens, done = stream(proxy_url, model)
        print(f"with cut:   {tokens} tokens, [DONE] {done}  ({text!r})")
        ok = ok and not done and tokens == CUT_AFTER
    print(f"removed:    faults now {control.faults()}")

    text, tokens, done = stream(proxy_url, model)
    print(f"clean:      {tokens} tokens, [DONE] {done}")
    ok = ok and done and tokens > CUT_AFTER

    counters = control.counters()
    fired = control.fired()
    print(f"counters:   {counters['middlebox_connections_total']:g} connections, fired {fired}")
    journals = control.journals()
    print(f"journals:   {[(j['connection'], j['faults_fired']) for j in journals]}")
    return ok and counters["middlebox_connections_total"] == 3 and fired == {"cut": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxy", help="a running proxy's URL (default: start one)")
    parser.add_argument("--control", help="its control API's URL")
    parser.add_argument("--model", default="", help="model to ask for (default: the first)")
    options = parser.parse_args()
    if options.proxy and options.control:
        model = options.model or "middlebox/emulated-7b"
        return 0 if demonstrate(options.proxy, ControlClient(options.control), model) else 1
    with tempfile.TemporaryDirectory(prefix="middlebox-example-") as scratch:
        emulator = EmulatorProcess({"itl": "10ms"}, Path(scratch))
        try:
            with start_proxy(emulator.url) as proxy:
                model = options.model or UpstreamClient(emulator.url).model()
                return 0 if demonstrate(proxy.url, proxy.control, model) else 1
        finally:
            emulator.stop()


if __name__ == "__main__":
    sys.exit(main())
