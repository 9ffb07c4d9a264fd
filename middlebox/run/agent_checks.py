"""Agent-stream checks: acting on a partial tool call, a side effect twice, invalid JSON,
reasoning shown as the answer or hidden (pure).

The seed article's rules for agent streams: tool-call arguments arrive as string
fragments, so "execute only after the call is complete" and "never act on a partial tool
call"; "retrying a non-idempotent side effect (a tool call that sent an email) needs
idempotency keys"; a JSON answer is valid only once closed; a reasoning model streams its
reasoning before the answer. What the upstream sent comes from the wire (the upstream leg
of the journal, framed once); what the client did comes from its result file's optional
`tool_calls_executed`, `json_acted_on` and `reasoning` fields (docs/clients.md).

Per request, worst first, these replace the text verdict (which cannot see them: a tool
call's answer has no text, so a cut call "shows" the whole empty answer):
- `acted_on_partial_call`: it executed arguments that are not the complete arguments of
  a call the upstream sent (a call is complete when its response finished or a later
  call began: `SentResponse.complete_calls`), or not valid JSON;
- `side_effect_repeated`: it executed one logical call (same tool and call index within
  the request) more than once without the same idempotency key each time;
- `acted_on_invalid_json`: it acted on JSON that does not parse, or that is not the
  complete JSON answer a finished generation sent (a repaired prefix);
- `reasoning_as_answer`: the reasoning the upstream streamed appears in `text`;
- `reasoning_hidden`: the upstream streamed reasoning and the client showed none of it,
  so the user waited through the reasoning phase without being told (only a `complete`
  text verdict is replaced by it).
`server.tool_call_tokens_wasted` counts argument fragments the upstream sent that never
reached the client (a cut with the server still generating).
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from middlebox.core.framed import LegRecord, is_event_stream
from middlebox.core.sse import SseEvent
from middlebox.core.stream import Direction
from middlebox.observe.journal import ConnectionJournal
from middlebox.scenario.expect import AGENT_METRICS

# Worst first; each replaces the text verdict of its request.
AGENT_VERDICTS = (
    "acted_on_partial_call",
    "side_effect_repeated",
    "acted_on_invalid_json",
    "reasoning_as_answer",
    "reasoning_hidden",
)
KEEP_VERDICTS = frozenset({"upstream_error", "hang", "no_result", "abandoned"})
REASONING_PROBE = 24
"""Characters of the upstream's reasoning that, found in `text`, prove it was shown as the
answer (long enough not to match by chance, short enough for a cut reasoning phase)."""


class _Judged(Protocol):
    index: int
    verdict: str


@dataclass
class SentCall:
    name: str = ""
    arguments: str = ""
    fragments: int = 0


@dataclass
class SentResponse:
    """What the upstream sent in one event-stream response (choice 0)."""

    body: str
    content: str = ""
    reasoning: str = ""
    calls: dict[int, SentCall] = field(default_factory=dict)
    finish_reason: str | None = None
    failed: bool = False

    @property
    def finished(self) -> bool:
        """Ended as the model meant: a finish_reason other than `length`, no error frame."""
        return self.finish_reason not in (None, "length") and not self.failed

    @property
    def fragments(self) -> int:
        return sum(call.fragments for call in self.calls.values())

    def complete_calls(self) -> list[SentCall]:
        """The calls a correct client may run, judged from the wire as it arrived: every
        call of a finished response, and in one that did not finish (a `max_tokens` cut,
        an error frame, a cut stream) each call after which another began. vLLM streams
        call N+1's name only once call N's arguments closed (the hermes parser after
        `</tool_call>`; `tool_choice: required` after the array's next object opens), so
        a later call proves the earlier one's arguments final. Seen on a real vLLM 0.32:
        `required` runs to `length` after two whole calls and the start of a third, and
        a named call ends `stop` with an empty delta (tests/run/captures/)."""
        calls = list(self.calls.values())  # in the order the calls began
        return calls if self.finished else calls[:-1]


def _record(leg: LegRecord | tuple[bytes, bytes]) -> LegRecord:
    return leg if isinstance(leg, LegRecord) else LegRecord.from_bytes(*leg)


def sent_responses(leg: LegRecord | tuple[bytes, bytes]) -> list[SentResponse]:
    """Each event-stream response of a leg: its request body, text, reasoning, tool calls
    (name and argument fragments by index), finish_reason and whether an error frame came."""
    record = _record(leg)
    found: dict[int, SentResponse] = {}
    for message, _, _, head in record.heads[Direction.DOWNSTREAM]:
        if is_event_stream(head):
            body = record.request_body(message).decode("utf-8", "replace")
            found[message] = SentResponse(body)
    for message, _, event in record.events[Direction.DOWNSTREAM]:
        response = found.get(message)
        if response is None or event.is_done or not event.data.startswith("{"):
            continue
        try:
            payload = json.loads(event.data)
        except ValueError:
            continue
        if not isinstance(payload, dict):
            continue
        if "error" in payload:
            response.failed = True
        choices = payload.get("choices")
        for choice in choices if isinstance(choices, list) else []:
            if isinstance(choice, dict) and choice.get("index", 0) == 0:
                _add_choice(response, choice)
    return list(found.values())


def _add_choice(response: SentResponse, choice: Mapping[str, Any]) -> None:
    if isinstance(choice.get("finish_reason"), str):
        response.finish_reason = choice["finish_reason"]
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return
    content = delta.get("content")
    response.content += content if isinstance(content, str) else ""
    thought = delta.get("reasoning") or delta.get("reasoning_content")
    response.reasoning += thought if isinstance(thought, str) else ""
    calls = delta.get("tool_calls")
    for entry in calls if isinstance(calls, list) else []:
        if not isinstance(entry, dict) or not isinstance(entry.get("index", 0), int):
            continue
        call = response.calls.setdefault(entry.get("index", 0), SentCall())
        function = entry.get("function")
        if not isinstance(function, dict):
            continue
        if isinstance(function.get("name"), str):
            call.name += function["name"]
        fragment = function.get("arguments")
        if isinstance(fragment, str) and fragment:
            call.arguments += fragment
            call.fragments += 1


def _parsed(value: Any) -> tuple[bool, Any]:
    """A reported value as JSON: a string is parsed (it is what the client held), any
    other value is what the client parsed already."""
    if not isinstance(value, str):
        return True, value
    try:
        return True, json.loads(value)
    except ValueError:
        return False, None


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


@dataclass
class RequestAgent:
    """The agent findings of one logical request."""

    executed: int = 0
    partial: int = 0
    repeated: int = 0
    invalid_json: int = 0
    reasoning_as_answer: bool = False
    reasoning_hidden: bool = False

    def verdict(self) -> str | None:
        flags = (
            self.partial > 0,
            self.repeated > 0,
            self.invalid_json > 0,
            self.reasoning_as_answer,
            self.reasoning_hidden,
        )
        return next((name for name, on in zip(AGENT_VERDICTS, flags, strict=True) if on), None)


def judge_request(
    result: Mapping[str, Any] | None, responses: Sequence[SentResponse]
) -> RequestAgent:
    """The agent findings of one request from its result and the upstream's responses to it."""
    found = RequestAgent()
    if result is None:
        return found
    # by call index where the client says which call it ran: two calls of one answer can
    # carry the same arguments, and only one of them may be complete
    complete_calls = {
        (index, call.name, _canonical(value))
        for response in responses
        for call in response.complete_calls()
        for index in [next(i for i, c in response.calls.items() if c is call)]
        for ok, value in [_parsed(call.arguments)]
        if ok
    }
    any_index = {(name, value) for _, name, value in complete_calls}
    groups: dict[tuple[str, str], list[Any]] = {}
    for executed in result.get("tool_calls_executed") or []:
        if not isinstance(executed, Mapping):
            continue
        found.executed += 1
        name = str(executed.get("name") or "")
        ok, value = _parsed(executed.get("arguments"))
        index = executed.get("index")
        known = (
            (index, name, _canonical(value)) in complete_calls
            if isinstance(index, int)
            else (name, _canonical(value)) in any_index
        )
        if not ok or not known:
            found.partial += 1
        logical = str(index) if isinstance(index, int) else (_canonical(value) if ok else "?")
        groups.setdefault((name, logical), []).append(executed.get("idempotency_key"))
    for keys in groups.values():
        if len(keys) > 1 and (None in keys or len(set(keys)) > 1):
            # each distinct key (and each keyless run) is one more side effect
            found.repeated += len(set(keys) - {None}) + keys.count(None) - 1
    complete_json = {
        _canonical(value)
        for response in responses
        if response.finished and not response.calls
        for ok, value in [_parsed(response.content)]
        if ok
    }
    for acted in result.get("json_acted_on") or []:
        if not isinstance(acted, Mapping):
            continue
        ok, value = _parsed(acted.get("text", acted.get("value")))
        if not ok or _canonical(value) not in complete_json:
            found.invalid_json += 1
    reasonings = [r.reasoning.strip() for r in responses if r.reasoning.strip()]
    if reasonings:
        shown = str(result.get("text") or "")
        probes = {r[:REASONING_PROBE] for r in reasonings}
        found.reasoning_as_answer = any(probe in shown for probe in probes)
        found.reasoning_hidden = not found.reasoning_as_answer and not result.get("reasoning")
    return found


def reasoning_ttft_ms(result: Mapping[str, Any]) -> float | None:
    pieces = [float(t) for t, piece in result.get("reasoning") or [] if piece]
    if not pieces or not result.get("started_at"):
        return None
    return (pieces[0] - float(result["started_at"])) * 1000


def judge_agents(
    requests: Sequence[_Judged],
    tags: Sequence[str],
    results: Mapping[int, Mapping[str, Any]],
    upstream_traffic: Sequence[LegRecord | tuple[bytes, bytes]],
    client_traffic: Sequence[LegRecord | tuple[bytes, bytes]] | None,
) -> dict[str, Any]:
    """Apply the agent verdicts to `requests` (in place) and return the agent metrics."""
    upstream = [sent_responses(leg) for leg in upstream_traffic]
    every = [response for responses in upstream for response in responses]
    metrics: dict[str, Any] = {name: 0 for name in AGENT_METRICS}
    metrics["client.reasoning_ttft_ms"] = []
    for request in requests:
        tag = tags[request.index] if request.index < len(tags) else None
        ours = [response for response in every if tag is not None and tag in response.body]
        result = results.get(request.index)
        found = judge_request(result, ours)
        metrics["client.tool_calls_executed"] += found.executed
        metrics["client.partial_tool_calls_executed"] += found.partial
        metrics["client.side_effects_repeated"] += found.repeated
        metrics["client.invalid_json_acted_on"] += found.invalid_json
        metrics["client.reasoning_as_answer"] += int(found.reasoning_as_answer)
        metrics["client.reasoning_hidden"] += int(found.reasoning_hidden)
        wait = reasoning_ttft_ms(result) if result is not None else None
        if wait is not None:
            metrics["client.reasoning_ttft_ms"].append(wait)
        verdict = found.verdict()
        if verdict is None or request.verdict in KEEP_VERDICTS:
            continue
        if verdict == "reasoning_hidden" and request.verdict != "complete":
            continue
        request.verdict = verdict
    metrics["server.tool_call_tokens_wasted"] = tool_call_tokens_wasted(upstream, client_traffic)
    return metrics


def fragments_read_after_the_client_stopped(journals: Iterable[ConnectionJournal]) -> int:
    """Argument fragments the upstream sent after the client's stream stopped growing: in
    events whose bytes the proxy read after its last write toward the client. Those read
    in the same read as the client's last bytes were generated before the stream was cut,
    not for nobody: a real vLLM that stalls on a strict call's grammar sends most of the
    call in one read (12 KiB, some 40 fragments, with the 4th that a cut after 4 waits
    for), which `tool_call_tokens_wasted` counts as 40 fragments wasted. The emulator
    sends a fragment a write, so for it the two counts agree."""
    wasted = 0
    for journal in journals:
        writes = [r[0] for r in journal.records if r[1:4] == ("wrote", "client", "downstream")]
        reads = [
            (r[5], r[0]) for r in journal.records if r[1:4] == ("read", "upstream", "downstream")
        ]
        if not reads:
            continue
        stopped = max(writes, default=journal.started_at)
        starts = [offset for offset, _ in reads]
        for _, offset, event in journal.leg("upstream").events[Direction.DOWNSTREAM]:
            read_at = reads[max(bisect.bisect_right(starts, offset) - 1, 0)][1]
            if read_at > stopped:
                wasted += event_fragments(event)
    return wasted


def event_fragments(event: SseEvent) -> int:
    """Tool-call argument fragments in one event of choice 0 (as `sent_responses` counts)."""
    if event.is_done or not event.data.startswith("{"):
        return 0
    try:
        payload = json.loads(event.data)
    except ValueError:
        return 0
    scratch = SentResponse("")
    choices = payload.get("choices") if isinstance(payload, dict) else None
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict) and choice.get("index", 0) == 0:
            _add_choice(scratch, choice)
    return scratch.fragments


def tool_call_tokens_wasted(
    upstream: Sequence[Sequence[SentResponse]],
    client_traffic: Sequence[LegRecord | tuple[bytes, bytes]] | None,
) -> int:
    """Argument fragments the upstream sent on each connection beyond those its client
    leg carried: generated for nobody once a cut stopped the stream toward the client."""
    if client_traffic is None or len(client_traffic) != len(upstream):
        return 0
    wasted = 0
    for sent, leg in zip(upstream, client_traffic, strict=True):
        reached = sum(response.fragments for response in sent_responses(leg))
        wasted += max(sum(response.fragments for response in sent) - reached, 0)
    return wasted
