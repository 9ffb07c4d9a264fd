"""vLLM's wire shapes, byte for byte, per version profile (pure).

Every builder returns the exact bytes vLLM puts on the wire for the same values
(see shared/reference/vllm-wire.md §1-§2). vLLM serialises pydantic models with
`model_dump_json(exclude_unset=...)`: compact JSON, raw UTF-8, fields in class
order, and `null` for fields its code sets explicitly to None. We rebuild those
dicts in the same order and dump them the same way; the golden tests compare the
result with literal frames captured from vLLM's own models.

Profiles:
- `vllm-0.33`: 16-hex ids, `prompt_text`/`kv_transfer_params`/`weight_versions`
  nulls, `system_fingerprint`, compact in-band chat errors, spaced completions ones.
- `vllm-0.32`: the 0.33 layout without the stream chunks' top-level `kv_transfer_params`
  null and without `weight_versions` anywhere, and with spaced in-band chat errors;
  checked against a running vLLM 0.32.0 (CPU) by tests/real_vllm/ on every CI run.
- `vllm-0.11`: 32-hex ids, fewer nulls, completions chunks end in `"usage":null`,
  in-band errors default to BadRequestError/400 (vllm-project/vllm#22099 era).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from vllm_emulator.agent import (
    CONTENT,
    REASONING,
    SILENT,
    TOOL_ARGS,
    TOOL_NAME,
    AgentPlan,
    ToolCall,
)

Profile = Literal["vllm-0.33", "vllm-0.32", "vllm-0.11"]
FailureKind = Literal["generation", "retryable", "engine_dead"]
Endpoint = Literal["chat", "completions"]
StopReason = str | int | None

PROFILES: tuple[Profile, ...] = ("vllm-0.33", "vllm-0.32", "vllm-0.11")
VLLM_VERSION: dict[Profile, str] = {
    "vllm-0.33": "0.33.0",
    "vllm-0.32": "0.32.0",
    "vllm-0.11": "0.11.0",
}


def modern(profile: Profile) -> bool:
    """The 0.32+ layout (16-hex ids, fingerprint, `prompt_text`, reasoning, nested
    `param`-carrying errors); 0.11 is the only older one. Code that asks
    `profile == "vllm-0.33"` for these means this."""
    return profile != "vllm-0.11"


def weight_versions(profile: Profile) -> bool:
    """`weight_versions: null` on finish chunks and choices: new in 0.33."""
    return profile == "vllm-0.33"


def stream_kv_transfer_params(profile: Profile) -> bool:
    """A top-level `kv_transfer_params: null` on token chunks: new in 0.33 (0.32's stream
    chunks have none; its non-streaming bodies do)."""
    return profile == "vllm-0.33"


def reasoning_field(profile: Profile) -> str:
    """The reasoning parsers' delta and message field: `reasoning` since vLLM renamed it
    (0.32's non-streaming body has `"reasoning":null`), `reasoning_content` in 0.11."""
    return "reasoning" if modern(profile) else "reasoning_content"


def middleware_headers(profile: Profile) -> tuple[tuple[str, str], ...]:
    """Headers vLLM's ASGI middleware adds to every response, after the handler's own.

    vLLM always installs Starlette's CORSMiddleware (`serve/middleware/register.py`); from
    starlette#3516 (Sep 2026, in starlette 1.10.0) it writes `vary: Origin` on every plain
    response, Origin or not, so it lands after `content-type` and before uvicorn's
    `transfer-encoding`. Seen on every answer of the real 0.32.0 (tests/real_vllm/). The
    0.33 profile follows the reference's §5 literal, a bare Starlette app without it; a real
    0.33 with a current Starlette likely sends it too (it depends on Starlette, not vLLM).
    """
    return (("vary", "Origin"),) if profile == "vllm-0.32" else ()


DONE = b"data: [DONE]\n\n"
# vLLM 0.33's `--sse-keep-alive-interval` comment (serve/utils/sse_keep_alive.py).
KEEP_ALIVE = b": keep-alive\n\n"

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"  # Starlette appends the charset
JSON_CONTENT_TYPE = "application/json"


def dumps(obj: Any) -> str:
    """pydantic's `model_dump_json` / Starlette's JSONResponse: compact, raw UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def spaced(obj: Any) -> str:
    """`json.dumps(obj)` with its default separators, as `create_streaming_error_response`."""
    return json.dumps(obj)


def sse(payload: str) -> bytes:
    """One vLLM frame: `data: ` + payload + a blank line, never `\\r\\n`, no `id:`/`event:`."""
    return b"data: " + payload.encode("utf-8") + b"\n\n"


def id_hex_length(profile: Profile) -> int:
    """`random_uuid()`: 16 hex chars in 0.33 (64-bit mask), `uuid4().hex` (32) in 0.11."""
    return 16 if modern(profile) else 32


def response_id(endpoint: Endpoint, base: str) -> str:
    """`chatcmpl-<base>` or `cmpl-<base>`; base is X-Request-Id, body request_id or random."""
    return ("chatcmpl-" if endpoint == "chat" else "cmpl-") + base


def fingerprint(profile: Profile, model: str) -> str | None:
    """`vllm-<version>-<hash8>` (`--fingerprint-mode hash`); absent before 0.33."""
    if not modern(profile):
        return None
    digest = 0
    for byte in model.encode("utf-8"):  # FNV-1a: stable across processes, unlike hash()
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return f"vllm-{VLLM_VERSION[profile]}-{digest:08x}"


@dataclass(frozen=True)
class Usage:
    """UsageInfo; vLLM orders it prompt, total, completion (not OpenAI's order)."""

    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def as_dict(self, *extra_nulls: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.total_tokens,
            "completion_tokens": self.completion_tokens,
        }
        for name in extra_nulls:
            out[name] = None
        return out


# ------------------------------------------------------------------------ errors


def error_body(
    profile: Profile, message: str, error_type: str, code: int, param: str | None = None
) -> bytes:
    """An HTTP error body (status == code): the nested ErrorResponse since 0.10.1."""
    return dumps(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    ).encode("utf-8")


QUEUE_FULL_MESSAGE = (
    "The engine is currently busy and cannot accept new requests. Please try again later or on "
    "a different instance."
)  # QueueOverflowError, checked in _preflight before streaming starts (--max-num-queued-reqs)


def failure(endpoint: Endpoint, kind: FailureKind) -> tuple[str, str, int]:
    """(message, type, code) of a generation failure, as vLLM 0.33 reports it (§2.3).

    A GenerationError is 500 "Internal server error"; a RetryableRequestError is 503
    "Request failed; please retry", still typed InternalServerError by the chat stream
    but ServiceUnavailableError where the exception mapping runs (completions, and
    non-streaming responses); an EngineDeadError is 500 with its own message.
    """
    if kind == "engine_dead":
        return "The server had an error while processing your request.", "InternalServerError", 500
    if kind == "retryable":
        mapped = "InternalServerError" if endpoint == "chat" else "ServiceUnavailableError"
        return "Request failed; please retry", mapped, 503
    return "Internal server error", "InternalServerError", 500


UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'  # --api-key middleware: a plain string


def error_frame(
    profile: Profile,
    endpoint: Endpoint,
    message: str = "Internal server error",
    error_type: str = "InternalServerError",
    code: int = 500,
) -> bytes:
    """The in-band `data: {"error": ...}` frame sent when generation fails after the 200.

    0.33 chat dumps the ErrorResponse compactly; 0.33 completions and 0.32 both still
    use `json.dumps` (spaced). 0.10.1-0.11 use `json.dumps` with the defaults
    BadRequestError/400 whatever the failure (`create_streaming_error_response(str(e))`).
    """
    if profile == "vllm-0.11":
        error_type, code = "BadRequestError", 400
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    if profile == "vllm-0.33" and endpoint == "chat":
        return sse(dumps(body))
    return sse(spaced(body))


# ------------------------------------------------------------------------ streams


@dataclass
class StreamEncoder:
    """Turns engine outputs into vLLM's SSE frames for one streaming response.

    Call `output()` for each engine output of a choice (one or more tokens' text);
    the first call of the request also produces the chat role chunk of every choice,
    as vLLM does on its first engine output (i.e. at TTFT). Then `end()` gives the
    usage chunk (if asked) and `[DONE]`; `error()` gives an in-band error and `[DONE]`.
    """

    profile: Profile
    endpoint: Endpoint
    id: str
    created: int
    model: str
    prompt_tokens: int
    n: int = 1
    include_usage: bool = False
    continuous_usage: bool = False
    system_fingerprint: str | None = None
    role: str = "assistant"
    _started: bool = field(default=False, init=False)
    _tokens: list[int] = field(default_factory=list, init=False)
    _named: set[tuple[int, int]] = field(default_factory=set, init=False)  # (choice, call)

    def __post_init__(self) -> None:
        self._tokens = [0] * self.n
        # continuous_usage_stats only counts together with include_usage (should_include_usage).
        self.continuous_usage = self.continuous_usage and self.include_usage

    @property
    def completion_tokens(self) -> int:
        return sum(self._tokens)

    def _head(self) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.endpoint == "chat" else "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _usage(self, index: int) -> Usage:
        return Usage(self.prompt_tokens, self._tokens[index])

    def output(
        self,
        index: int,
        text: str,
        num_tokens: int = 1,
        finish_reason: str | None = None,
        stop_reason: StopReason = None,
        channel: str = CONTENT,
        tool: ToolCall | None = None,
    ) -> list[bytes]:
        """Frames for one engine output of choice `index` carrying `num_tokens` tokens.

        `channel` says what the text is (agent.py): answer content, reasoning, an argument
        fragment of `tool`, the token that names `tool`, or hidden markup, which sends no
        chunk at all unless it ends the choice (then an empty delta, as the captures show).
        """
        frames: list[bytes] = []
        if not self._started:
            self._started = True
            if self.endpoint == "chat":
                frames.extend(self._role_chunk(i) for i in range(self.n))
        self._tokens[index] += num_tokens
        if self.endpoint == "chat":
            if tool is not None and (index, tool.index) not in self._named:
                self._named.add((index, tool.index))
                if channel == TOOL_NAME:  # the name is this token's whole delta
                    name = self._tool_name_delta(tool)
                    frames.append(self._chat_chunk(index, "", finish_reason, stop_reason, name))
                    return frames
                # A named tool_choice: vLLM names the call in a chunk of its own first.
                frames.append(self._chat_chunk(index, "", None, None, self._tool_name_delta(tool)))
            delta = self._delta(text, channel, tool)
            if delta is None and finish_reason is None:
                return frames  # a hidden token: the parser returned no delta, vLLM sends nothing
            frames.append(self._chat_chunk(index, text, finish_reason, stop_reason, delta or {}))
        else:
            frames.append(self._completion_chunk(index, text, finish_reason, stop_reason))
        return frames

    def end(self) -> list[bytes]:
        """The final usage chunk (with include_usage) and `data: [DONE]`."""
        frames: list[bytes] = []
        if self.include_usage:
            chunk = self._head()
            chunk["choices"] = []
            chunk["usage"] = Usage(self.prompt_tokens, self.completion_tokens).as_dict()
            if self.system_fingerprint is not None:  # exclude_none on the usage chunk
                chunk["system_fingerprint"] = self.system_fingerprint
            frames.append(sse(dumps(chunk)))
        frames.append(DONE)
        return frames

    def error(
        self,
        message: str = "Internal server error",
        error_type: str = "InternalServerError",
        code: int = 500,
    ) -> list[bytes]:
        """A failure after the 200: one error frame, then `[DONE]` (§2.3)."""
        return [error_frame(self.profile, self.endpoint, message, error_type, code), DONE]

    def _continuous(self, chunk: dict[str, Any], index: int, *nulls: str) -> None:
        if self.continuous_usage:
            chunk["usage"] = self._usage(index).as_dict(*nulls)

    def _role_chunk(self, index: int) -> bytes:
        chunk = self._head()
        chunk["choices"] = [
            {
                "index": index,
                "delta": {"role": self.role, "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        if modern(self.profile):
            self._continuous(chunk, index, "completion_tokens_details")
            chunk["prompt_token_ids"] = None
            chunk["prompt_text"] = None
        else:
            self._continuous(chunk, index)
            chunk["prompt_token_ids"] = None
        return sse(dumps(chunk))

    def _tool_name_delta(self, tool: ToolCall) -> dict[str, Any]:
        call = {"id": tool.id, "type": "function", "index": tool.index,
                "function": {"name": tool.name}}  # fmt: skip
        return {"content": None, "tool_calls": [call]}

    def _delta(self, text: str, channel: str, tool: ToolCall | None) -> dict[str, Any] | None:
        if channel == REASONING:
            return {reasoning_field(self.profile): text}
        if channel == TOOL_ARGS and tool is not None:
            call = {"index": tool.index, "function": {"arguments": text}}
            return {"content": None, "tool_calls": [call]}
        if channel in (SILENT, TOOL_NAME):
            return None
        return {"content": text}

    def _chat_chunk(
        self,
        index: int,
        text: str,
        finish_reason: str | None,
        stop_reason: StopReason,
        delta: dict[str, Any] | None = None,
    ) -> bytes:
        new = modern(self.profile)
        choice: dict[str, Any] = {
            "index": index,
            "delta": {"content": text} if delta is None else delta,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if finish_reason is not None:
            choice["stop_reason"] = stop_reason
        choice["token_ids"] = None
        if finish_reason is not None and weight_versions(self.profile):
            choice["weight_versions"] = None
        if new:
            return self._new_chunk(choice, index, finish_reason, "completion_tokens_details")
        chunk = self._head()
        chunk["choices"] = [choice]
        self._continuous(chunk, index)
        return sse(dumps(chunk))

    def _new_chunk(
        self, choice: dict[str, Any], index: int, finish_reason: str | None, *nulls: str
    ) -> bytes:
        """A 0.32+ token chunk: usage (continuous), fingerprint (finish, no usage), kv nulls."""
        chunk = self._head()
        chunk["choices"] = [choice]
        self._continuous(chunk, index, *nulls)
        if finish_reason is not None and not self.include_usage:
            chunk["system_fingerprint"] = self.system_fingerprint
        if stream_kv_transfer_params(self.profile):
            chunk["kv_transfer_params"] = None
        return sse(dumps(chunk))

    def _completion_chunk(
        self, index: int, text: str, finish_reason: str | None, stop_reason: StopReason
    ) -> bytes:
        new = modern(self.profile)
        choice: dict[str, Any] = {
            "index": index,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": stop_reason,
            "prompt_token_ids": None,
            "token_ids": None,
        }
        if weight_versions(self.profile):
            choice["weight_versions"] = None
        if new:
            return self._new_chunk(choice, index, finish_reason)
        chunk = self._head()
        chunk["choices"] = [choice]
        if self.continuous_usage:
            # 0.11 dumps completions chunks with exclude_unset=False: every field shows.
            chunk["usage"] = self._usage(index).as_dict("prompt_tokens_details")
        else:
            chunk["usage"] = None
        return sse(dumps(chunk))


# ------------------------------------------------------------------ full bodies


@dataclass(frozen=True)
class Choice:
    """One finished choice of a non-streaming response."""

    index: int
    text: str
    finish_reason: str
    stop_reason: StopReason = None
    # Agent output (agent.py): the parsed calls (`content` is then "" for a named or required
    # tool_choice and null for auto, as serving.py builds the message) and the reasoning.
    tool_calls: tuple[ToolCall, ...] = ()
    content_null: bool = False
    reasoning: str | None = None


def agent_choice(index: int, planned: AgentPlan) -> Choice:
    """A non-streaming choice of agent output, as serving.py's full generator builds it: a named
    or required tool_choice gives `content: ""` and the calls; auto (hermes) gives
    `content: null` and the calls once they parse, else the raw text; a named call cut by
    max_tokens keeps its partial arguments (they are the whole output)."""
    plan = planned.plan
    reasoning = planned.reasoning if planned.reasoning_tokens else None
    if planned.mode == "named":
        cut = ToolCall(0, planned.tool_calls[0].id, planned.tool_calls[0].name, planned.raw_answer)
        return Choice(index, "", plan.finish_reason, None, (cut,), reasoning=reasoning)
    if planned.mode in ("required", "auto"):
        if planned.complete:
            return Choice(index, "", "tool_calls", None, planned.tool_calls,
                          content_null=planned.mode == "auto", reasoning=reasoning)  # fmt: skip
        return Choice(index, planned.raw_answer, planned.engine_finish_reason,
                      reasoning=reasoning)  # fmt: skip
    return Choice(index, plan.text, plan.finish_reason, plan.stop_reason, reasoning=reasoning)


def chat_response(
    profile: Profile,
    id: str,
    created: int,
    model: str,
    choices: list[Choice],
    usage: Usage,
    system_fingerprint: str | None = None,
    role: str = "assistant",
) -> bytes:
    """A non-streaming chat body: `JSONResponse(model.model_dump())`, all nulls kept."""
    new = modern(profile)
    out_choices: list[dict[str, Any]] = []
    for choice in choices:
        message: dict[str, Any] = {
            "role": role,
            "content": None if choice.content_null else choice.text,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
        }
        calls = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in choice.tool_calls
        ]  # fmt: skip
        if calls or not new:
            message["tool_calls"] = calls  # an empty list is dropped from 0.32 on
        message[reasoning_field(profile)] = choice.reasoning
        item: dict[str, Any] = {
            "index": choice.index,
            "message": message,
            "logprobs": None,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
            "token_ids": None,
        }
        if new:
            item["routed_experts"] = None
        if weight_versions(profile):
            item["weight_versions"] = None
        out_choices.append(item)
    body = _full_body(
        profile, id, "chat.completion", created, model, out_choices, usage, system_fingerprint
    )
    if new:
        body.update(
            prompt_logprobs=None,
            prompt_token_ids=None,
            prompt_text=None,
            kv_transfer_params=None,
            ec_transfer_params=None,
            metrics=None,
        )
    else:
        body.update(prompt_logprobs=None, prompt_token_ids=None, kv_transfer_params=None)
    return dumps(body).encode("utf-8")


def completion_response(
    profile: Profile,
    id: str,
    created: int,
    model: str,
    choices: list[Choice],
    usage: Usage,
    system_fingerprint: str | None = None,
) -> bytes:
    """A non-streaming /v1/completions body (full dump; shape follows CompletionResponse)."""
    out_choices: list[dict[str, Any]] = []
    for choice in choices:
        item: dict[str, Any] = {
            "index": choice.index,
            "text": choice.text,
            "logprobs": None,
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.stop_reason,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
        }
        if profile == "vllm-0.32":
            item["routed_experts"] = None  # seen on 0.32.0; 0.33's source not yet checked
        if weight_versions(profile):
            item["weight_versions"] = None
        out_choices.append(item)
    body = _full_body(
        profile, id, "text_completion", created, model, out_choices, usage, system_fingerprint
    )
    body["kv_transfer_params"] = None
    if profile == "vllm-0.32":  # seen on 0.32.0, as on its chat bodies
        body.update(ec_transfer_params=None, metrics=None)
    return dumps(body).encode("utf-8")


def _full_body(
    profile: Profile,
    id: str,
    obj: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage: Usage,
    system_fingerprint: str | None,
) -> dict[str, Any]:
    nulls = ("prompt_tokens_details", "completion_tokens_details")
    return {
        "id": id,
        "object": obj,
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": system_fingerprint,
        "usage": usage.as_dict(*(nulls if modern(profile) else nulls[:1])),
    }
