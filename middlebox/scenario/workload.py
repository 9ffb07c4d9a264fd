"""What the clients under test ask for in a scenario: the `workload:` block (pure).

The runner turns a `Workload` into one workload file per client (the client
contract in `middlebox.clients`), tagging each request's prompt with
`[middlebox SCENARIO/CLIENT/INDEX]` so the scorer can find every generation of it
in the upstream's ledger, retries included.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from middlebox.core.fault import Seconds

FILLER = [
    "Explain",
    "how",
    "server-sent",
    "events",
    "travel",
    "through",
    "proxies",
    "buffers",
    "and",
    "gateways",
]


@dataclass(frozen=True)
class Workload:
    """Requests each client makes: how many, how fast, what they ask, when they give up."""

    requests: int = 2
    concurrency: int = 1
    interval: Seconds = 0.0
    endpoint: Literal["chat", "completions"] = "chat"
    prompt_words: int = 16
    max_tokens: int = 40
    stream: bool = True
    include_usage: bool = True
    abandon_after_tokens: int | None = None
    abandon_after_seconds: Seconds | None = None
    clients: list[str] | None = None
    timeout: Seconds = 20.0
    # Agent requests (chat only), sent verbatim as the OpenAI fields of the same name:
    # `tools` a list of {"type": "function", "function": {name, description, parameters}},
    # `tool_choice` "auto" | "none" | "required" | {"type": "function", "function":
    # {"name": ...}}, `response_format` {"type": "json_object"} or {"type": "json_schema",
    # "json_schema": {"name": ..., "schema": {...}}} (docs/emulator.md, "Agent streams").
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1:
            raise ValueError("requests and concurrency must be at least 1")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        agent_fields = (self.tools, self.tool_choice, self.response_format)
        if self.endpoint != "chat" and any(value is not None for value in agent_fields):
            raise ValueError("tools, tool_choice and response_format need endpoint: chat")


def request_tag(scenario: str, client: str, index: int) -> str:
    return f"[middlebox {scenario}/{client}/{index}]"


def request_body(workload: Workload, model: str, tag: str) -> dict[str, Any]:
    words = " ".join(FILLER[i % len(FILLER)] for i in range(workload.prompt_words))
    text = f"{tag} {words}"
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": workload.max_tokens,
        "stream": workload.stream,
    }
    if workload.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": text}]
        for name in ("tools", "tool_choice", "response_format"):
            if getattr(workload, name) is not None:
                body[name] = getattr(workload, name)
    else:
        body["prompt"] = text
    if workload.stream and workload.include_usage:
        body["stream_options"] = {"include_usage": True}
    return body


def workload_file(workload: Workload, scenario: str, client: str, model: str) -> dict[str, Any]:
    """The JSON document a client process reads (see middlebox/clients)."""
    return {
        "scenario": scenario,
        "concurrency": workload.concurrency,
        "requests": [
            {
                "index": index,
                "endpoint": workload.endpoint,
                "body": request_body(workload, model, request_tag(scenario, client, index)),
                "start_after": index * workload.interval,
                "abandon_after_tokens": workload.abandon_after_tokens,
                "abandon_after_seconds": workload.abandon_after_seconds,
            }
            for index in range(workload.requests)
        ],
    }
