"""What each built-in client does by default, and the one-line fix for what goes wrong.

Plain data for the compatibility matrix (docs/compatibility.md, `make matrix`): the
library a client drives (its version is read where it is installed), its default timeout,
retries and resume, and for the three outcomes a user cannot see coming (a silent
truncation, a hang, mojibake) the one change to that library's usage that removes it.
The defaults are the libraries' own documented ones, as each driver's docstring states;
the verdicts in the matrix are measured, never taken from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FINISH_CHECK = "treat a stream that ended without finish_reason (or [DONE]) as an error and retry"


@dataclass(frozen=True)
class ClientFacts:
    library: str  # the distribution (PyPI or npm) the client drives; "" for none
    runtime: str  # "python" (.venv), "python-env" (its own environment), "node", "chromium"
    timeout: str
    retries: str
    resume: str
    fixes: dict[str, str] = field(default_factory=dict)  # verdict -> the one-line fix


CLIENT_FACTS: dict[str, ClientFacts] = {
    "raw": ClientFacts(
        "httpx", "python", "none after connecting (curl -N)", "none", "none",
        {
            "silent_truncation": "curl --fail and check for data: [DONE] before trusting the text",
            "hang": "curl --max-time / --speed-time, or a read timeout in the script",
            "mojibake": "decode whole lines, never single reads",
        },
    ),
    "openai": ClientFacts(
        "openai", "python", "600 s read, 5 s connect", "2 (429, 5xx, connection errors; "
        "Retry-After honoured), none once streaming", "none",
        {
            "silent_truncation": FINISH_CHECK,
            "hang": "AsyncOpenAI(timeout=httpx.Timeout(30, read=10)) for a stall timeout",
        },
    ),
    "openai-v1": ClientFacts(
        "openai", "python-env", "600 s read, 5 s connect", "2, none once streaming", "none",
        {
            "silent_truncation": FINISH_CHECK,
            "hang": "AsyncOpenAI(timeout=httpx.Timeout(30, read=10)); catch httpx errors too",
        },
    ),
    "openai-v2": ClientFacts(
        "openai", "python-env", "600 s read, 5 s connect", "2, none once streaming", "none",
        {
            "silent_truncation": FINISH_CHECK,
            "hang": "AsyncOpenAI(timeout=httpx.Timeout(30, read=10)); catch httpx errors too",
        },
    ),
    "openai-responses": ClientFacts(
        "openai", "python", "600 s read, 5 s connect", "2, none once streaming", "none",
        {
            "silent_truncation": "treat a stream that ended before response.completed as an "
            "error; check response.status and incomplete_details",
            "hang": "AsyncOpenAI(timeout=httpx.Timeout(30, read=10)) for a stall timeout",
        },
    ),
    "openai-responses-resume": ClientFacts(
        "openai", "python", "600 s read, 5 s connect", "2, none once streaming",
        "responses.retrieve(id, stream=True, starting_after=N) on a background response",
        {
            "silent_truncation": "check response.status and incomplete_details at the end",
            "hang": "AsyncOpenAI(timeout=httpx.Timeout(30, read=10)), then resume",
        },
    ),
    "openai-responses-restart": ClientFacts(
        "openai", "python", "600 s read, 5 s connect", "2, none once streaming",
        "none: a broken background stream is created again (a new response), shown on top",
        {
            "silent_truncation": "check response.status and incomplete_details at the end",
            "hang": "AsyncOpenAI(timeout=httpx.Timeout(30, read=10)), then resume by "
            "responses.retrieve(id, stream=True, starting_after=N) instead of creating again",
        },
    ),
    "anthropic-messages": ClientFacts(
        "anthropic", "python-env", "600 s", "2, none once streaming", "none",
        {
            "silent_truncation": "treat a stream without message_stop (stop_reason None) as an "
            "error; check stop_reason != 'max_tokens'",
            "hang": "AsyncAnthropic(timeout=httpx.Timeout(30, read=10)) for a stall timeout",
        },
    ),
    "openai-agents": ClientFacts(
        "openai-agents", "python-env", "600 s read, 5 s connect (the openai SDK's)",
        "2 (the openai SDK's), none once streaming; none of the runner's (retry unset)", "none",
        {
            "hang": "OpenAIResponsesModel(openai_client=AsyncOpenAI(timeout=openai.Timeout(30, "
            "read=10))), or ModelSettings(timeout=...) for the whole call",
        },
    ),
    "httpx-sse": ClientFacts(
        "httpx-sse", "python", "5 s (httpx default, per read)", "none", "none",
        {
            "silent_truncation": "break only on data: [DONE]; an end without it is an error",
            "hang": "keep httpx's read timeout (do not pass timeout=None)",
        },
    ),
    "resilient": ClientFacts(
        "", "python", "30 s to the first event, 10 s stall", "up to 3 without progress, "
        "8 attempts; Retry-After honoured", "Last-Event-ID when events carry id:",
    ),
    "aiohttp-lines": ClientFacts(
        "aiohttp", "python", "300 s total, no read timeout", "none", "none",
        {
            "silent_truncation": "treat an end of the body before data: [DONE] as an error",
            "hang": "ClientTimeout(sock_read=10) for a stall timeout",
        },
    ),
    "aiohttp-naive": ClientFacts(
        "aiohttp", "python", "300 s total, no read timeout", "none", "none",
        {
            "silent_truncation": "treat an end of the body before data: [DONE] as an error",
            "hang": "ClientTimeout(sock_read=10) for a stall timeout",
            "mojibake": "decode with codecs.getincrementaldecoder('utf-8')(), or iterate "
            "response.content by lines",
        },
    ),
    "langchain-openai": ClientFacts(
        "langchain-openai", "python-env", "600 s read (the openai SDK's)",
        "2 (the openai SDK's), none once streaming", "none",
        {
            "silent_truncation": "check the last chunk's response_metadata['finish_reason']",
            "hang": "ChatOpenAI(timeout=30) plus a stall timeout around astream()",
        },
    ),
    "litellm": ClientFacts(
        "litellm", "python-env", "6000 s (request_timeout)",
        "none of its own (num_retries unset); the openai SDK's 2", "none",
        {
            "silent_truncation": "check the last chunk's finish_reason: litellm may fill it in",
            "hang": "acompletion(..., timeout=30, stream_timeout=10)",
        },
    ),
    "browser": ClientFacts(
        "chromium", "chromium", "none (fetch)", "none", "none",
        {
            "silent_truncation": "check for data: [DONE] or finish_reason before trusting it",
            "hang": "AbortSignal.timeout() or a stall timer that aborts the fetch",
            "mojibake": "TextDecoderStream, or TextDecoder.decode(chunk, {stream: true})",
        },
    ),
    "browser-eventsource": ClientFacts(
        "chromium", "chromium", "none",
        "reconnects after errors (at most 5 in a row here); GET only: needs a resumable "
        "server's stream, else an error",
        "Last-Event-ID (EventSource's own)",
        {
            "silent_truncation": "close on [DONE] only and treat other ends as errors",
            "hang": "a stall timer that closes the EventSource and reconnects",
        },
    ),
    "node-openai": ClientFacts(
        "openai", "node", "600 s (10 min)", "2, none once streaming", "none",
        {
            "silent_truncation": FINISH_CHECK,
            "hang": "new OpenAI({timeout: 30_000}) and an AbortController stall timer",
        },
    ),
    "node-ai-sdk": ClientFacts(
        "ai", "node", "none (fetch)", "2 (maxRetries), none once streaming", "none",
        {
            "silent_truncation": "check await result.finishReason is 'stop' or 'length'",
            "hang": "streamText({abortSignal: AbortSignal.timeout(ms)})",
        },
    ),
    "node-eventsource": ClientFacts(
        "eventsource", "node", "none",
        "reconnects after any end but [DONE] (3 s, or the server's retry:), re-sending the "
        "POST: a new answer appended; none after a non-200",
        "Last-Event-ID (its own reconnect), with X-Stream-Id when the server named one",
        {
            "silent_truncation": "close on [DONE] only and treat other ends as errors",
            "hang": "a stall timer that closes the EventSource and reconnects",
        },
    ),
    "node-fetch-event-source": ClientFacts(
        "@microsoft/fetch-event-source", "node", "none", "retries on error (onerror "
        "returns)", "last-event-id header on its retries",
        {
            "silent_truncation": "throw in onclose unless [DONE] was seen, so it retries",
            "hang": "pass signal: AbortSignal.timeout(ms) or a stall timer",
        },
    ),
    "node-fetch-naive": ClientFacts(
        "", "node", "none (fetch)", "none", "none",
        {
            "silent_truncation": "treat an end of the body before data: [DONE] as an error",
            "hang": "AbortSignal.timeout() or a stall timer that aborts the fetch",
            "mojibake": "new TextDecoder().decode(chunk, {stream: true}) (or TextDecoderStream)",
        },
    ),
    "node-openai-responses": ClientFacts(
        "openai", "node", "600 s (10 min)", "2, none once streaming", "none",
        {
            "silent_truncation": "treat a stream that ended before response.completed as an "
            "error; check response.status and incomplete_details",
            "hang": "new OpenAI({timeout: 30_000}) and an AbortController stall timer",
        },
    ),
    "node-anthropic": ClientFacts(
        "@anthropic-ai/sdk", "node", "600 s (10 min)", "2, none once streaming", "none",
        {
            "silent_truncation": "await stream.finalMessage() (it throws without message_stop); "
            "check stop_reason != 'max_tokens'",
            "hang": "new Anthropic({timeout: 30_000}) and an AbortController stall timer",
        },
    ),
    "node-ai-sdk-responses": ClientFacts(
        "ai", "node", "none (fetch)", "2 (maxRetries), none once streaming", "none",
        {
            "silent_truncation": "treat a finishReason other than 'stop' or 'length' as an error",
            "hang": "streamText({abortSignal: AbortSignal.timeout(ms)})",
        },
    ),
    "node-ai-sdk-anthropic": ClientFacts(
        "ai", "node", "none (fetch)", "2 (maxRetries), none once streaming", "none",
        {
            "silent_truncation": "treat a finishReason other than 'stop' or 'length' as an error",
            "hang": "streamText({abortSignal: AbortSignal.timeout(ms)})",
        },
    ),
}  # fmt: skip
