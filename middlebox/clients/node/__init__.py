"""The Node clients under test: one small JavaScript driver per library, run by Node.

Each name maps to an argv that starts `python -m middlebox.clients.node.launch NAME`: the
launcher installs the pinned packages (`npm ci` from the committed package-lock.json into
this folder's node_modules/, never globally) the first time, stamped with the lockfile's
hash like `.venv`'s stamp, then becomes `node DRIVER.mjs`. The drivers share the contract
(docs/clients.md) in contract.mjs and each uses its library the way its README shows:

- `node-openai`: the official `openai` package (`openai_sdk.mjs`);
- `node-ai-sdk`: the Vercel AI SDK, `streamText` over `@ai-sdk/openai-compatible` (`ai_sdk.mjs`);
- `node-eventsource`: the `eventsource` package POSTing the request through its `fetch`
  option, closed on `[DONE]`; any other end makes it reconnect and ask again, with
  `Last-Event-ID` (`eventsource_reader.mjs`);
- `node-fetch-event-source`: `@microsoft/fetch-event-source` (`fetch_event_source.mjs`);
- `node-fetch-naive`: fetch() decoding each read with `new TextDecoder().decode(chunk)`,
  without `{stream: true}`: the mojibake producer (`fetch_naive.mjs`);
- `node-openai-responses`: the `openai` package's `responses.create({stream: true})`
  (`openai_responses.mjs`);
- `node-anthropic`: `@anthropic-ai/sdk`'s `messages.stream` (`anthropic_sdk.mjs`);
- `node-ai-sdk-responses`, `node-ai-sdk-anthropic`: `streamText` over `@ai-sdk/openai`'s
  Responses model and over `@ai-sdk/anthropic` (`ai_sdk_responses.mjs`, `ai_sdk_anthropic.mjs`).

The last four speak the Responses and Anthropic Messages APIs: `api_requests.mjs` maps the
workload's chat request onto them and reads their events by core/dialects.py's rule.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

DRIVERS: dict[str, str] = {
    "node-openai": "openai_sdk.mjs",
    "node-ai-sdk": "ai_sdk.mjs",
    "node-eventsource": "eventsource_reader.mjs",
    "node-fetch-event-source": "fetch_event_source.mjs",
    "node-fetch-naive": "fetch_naive.mjs",
    "node-openai-responses": "openai_responses.mjs",
    "node-anthropic": "anthropic_sdk.mjs",
    "node-ai-sdk-responses": "ai_sdk_responses.mjs",
    "node-ai-sdk-anthropic": "ai_sdk_anthropic.mjs",
}

# The drivers that speak chat completions (the workload's own API); the others send the same
# conversation as a Responses or Anthropic Messages request (api_requests.mjs).
CHAT_DRIVERS = ("node-openai", "node-ai-sdk", "node-eventsource", "node-fetch-event-source",
                "node-fetch-naive")  # fmt: skip

NODE_CLIENTS: dict[str, list[str]] = {
    name: [sys.executable, "-m", "middlebox.clients.node.launch", name] for name in DRIVERS
}

# eventsource 4 declares node >= 20 (the other packages >= 18).
MIN_NODE = (20, 0)


def node_version(node: str) -> tuple[int, ...] | None:
    """`node --version` as numbers (v20.20.2 -> (20, 20, 2)), or None when it does not run."""
    try:
        out = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=20, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.match(r"v(\d+)\.(\d+)\.(\d+)", out.strip())
    return tuple(int(part) for part in found.groups()) if found else None


@functools.cache
def node_available() -> bool:
    """Node (new enough) and npm are installed, so the Node clients can run here."""
    node = shutil.which("node")
    if node is None or shutil.which("npm") is None:
        return False
    version = node_version(node)
    return version is not None and version[:2] >= MIN_NODE
