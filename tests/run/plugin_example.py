"""What a user writes with the plugin (run by test_plugin.py in a subprocess, also
with pytest-xdist): one test passes, the other fails because its scenario cuts the
stream before `[DONE]`. Not collected by the project's own run (no `test_` prefix)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

DATA = Path(__file__).parent / "data"


def stream(base_url: str, model: str, max_tokens: int = 30) -> tuple[str, bool]:
    """A plain streaming chat request: the text shown and whether [DONE] arrived."""
    url = urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
            "stream": True, "max_tokens": max_tokens}  # fmt: skip
    connection.request("POST", f"{url.path}/chat/completions", json.dumps(body),
                       {"Content-Type": "application/json"})  # fmt: skip
    response = connection.getresponse()
    text, done = "", False
    for raw in response:
        line = raw.strip()
        if line == b"data: [DONE]":
            done = True
        elif line.startswith(b"data: "):
            for choice in json.loads(line[6:]).get("choices") or []:
                text += (choice.get("delta") or {}).get("content") or ""
    connection.close()
    return text, done


def test_the_stream_completes_through_a_small_delay(middlebox_proxy: Any) -> None:
    proxy = middlebox_proxy(DATA / "plugin_ok.yaml")
    text, done = stream(proxy.base_url, proxy.model)
    assert done and text
    assert proxy.score()["faults_fired"] == {"latency": 1}


def test_the_stream_completes_through_a_duration_cap(middlebox_proxy: Any) -> None:
    proxy = middlebox_proxy(DATA / "plugin_cut.yaml")
    text, done = stream(proxy.base_url, proxy.model)
    assert done, f"cut after {len(text)} characters without [DONE]"
