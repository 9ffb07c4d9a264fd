"""The ledger: one record per request, what the scorer reads from `GET /emulator/requests`.

Each entry says what the emulator planned to generate, what it generated and when, what it
wrote and when, and how the request ended (finished, failed, aborted, client gone). The
JSON shape is the contract in docs/emulator.md; `wasted_tokens` counts tokens generated
after the client left and never delivered. Pure: plain data, times are given, not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# The API a request came in as: chat and completions, the Responses API, Anthropic Messages.
Api = Literal["chat", "completions", "responses", "messages"]


@dataclass
class LedgerEntry:
    """One request as the scorer sees it (the contract is in docs/emulator.md)."""

    request_id: str
    endpoint: Api
    model: str | None
    stream: bool
    prompt: Any
    prompt_tokens: int
    max_tokens: int | None
    received_at: float
    id: str | None = None
    stream_id: str | None = None
    n: int = 1
    first_token_at: float | None = None
    finished_at: float | None = None
    planned_text: str | None = None
    planned_texts: list[str] = field(default_factory=list)
    planned_tokens: int = 0
    completion_tokens: int = 0
    token_times: list[float] = field(default_factory=list)
    bytes_written: int = 0
    write_times: list[float] = field(default_factory=list)
    delivered_tokens: int = 0
    disconnected_at: float | None = None
    aborted_at: float | None = None
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    status: int | None = None
    resumed_from: int | None = None
    resumes: int = 0
    cassette: bool = False
    texts: list[str] = field(default_factory=list)
    # Agent output (agent.py; docs/emulator.md "Agent streams"), choice 0 unless counted.
    output_kind: str = "text"  # text | tool_calls | json
    tool_choice_mode: str | None = None  # named | required | auto (null: no tools)
    planned_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    planned_reasoning: str | None = None
    reasoning: str = ""
    planned_reasoning_tokens: int = 0
    reasoning_tokens: int = 0  # generated so far, every choice
    output_complete: bool = True
    engine_finish_reason: str | None = None
    # Responses API: a background response (outlives its client) and when it was cancelled.
    background: bool = False
    cancelled_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        wasted = 0
        if self.disconnected_at is not None:
            wasted = max(0, self.completion_tokens - self.delivered_tokens)
        return {
            "request_id": self.request_id,
            "id": self.id,
            "endpoint": self.endpoint,
            "model": self.model,
            "stream": self.stream,
            "prompt": self.prompt,
            "prompt_tokens": self.prompt_tokens,
            "max_tokens": self.max_tokens,
            "n": self.n,
            "received_at": self.received_at,
            "first_token_at": self.first_token_at,
            "finished_at": self.finished_at,
            "planned_text": self.planned_text,
            "planned_texts": self.planned_texts,
            "planned_tokens": self.planned_tokens,
            "text": self.texts[0]
            if self.texts
            else ("" if self.planned_text is not None else None),
            "texts": self.texts,
            "completion_tokens": self.completion_tokens,
            "token_times": self.token_times,
            "bytes_written": self.bytes_written,
            "write_times": self.write_times,
            "delivered_tokens": self.delivered_tokens,
            "disconnected_at": self.disconnected_at,
            "aborted_at": self.aborted_at,
            "finish_reason": self.finish_reason,
            "stop_reason": self.stop_reason,
            "wasted_tokens": wasted,
            "status": self.status,
            "stream_id": self.stream_id,
            "resumed_from": self.resumed_from,
            "resumes": self.resumes,
            "cassette": self.cassette,
            "output_kind": self.output_kind,
            "tool_choice_mode": self.tool_choice_mode,
            "planned_tool_calls": self.planned_tool_calls,
            "tool_calls": self.tool_calls,
            "planned_reasoning": self.planned_reasoning,
            "reasoning": self.reasoning,
            "planned_reasoning_tokens": self.planned_reasoning_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "output_complete": self.output_complete,
            "engine_finish_reason": self.engine_finish_reason,
            "background": self.background,
            "cancelled_at": self.cancelled_at,
        }
