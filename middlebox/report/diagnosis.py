"""What a run's numbers say: the symptom figures, a one-line diagnosis and, per failed
check, why it failed and what to do (pure; reads one result of the report document).

The scorecard, junit.xml and report.html all take their words from here, so a failure
reads the same wherever it is seen. A diagnosis is drawn from the verdicts and metrics
first (what the user saw), then from the faults that fired (what the path did); the fix
it names is the usual one for that symptom (nginx's `proxy_buffering off`, vLLM's
`X-Accel-Buffering: no`, a client that checks `finish_reason`), and a scenario's own
`hint:` or description overrides it for a failed check.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass
from typing import Any

# A stream the path delivers (the client leg of the journal, else as the client showed it)
# at this many times the upstream's own tokens per burst (the scorer's 10 ms groups,
# `server.tokens_per_burst`) was held by a hop: vLLM flushes every token, so a direct
# stream shows about what the upstream made (1 at 15 ms a token; at 5 ms a token the
# whole answer is one burst at its source, and so it is at the client). With a buffering
# fault in the path 3 is enough: haproxy-coalescing's 60 ms window at 15 ms a token
# merges 4 of the upstream's bursts (3.9 measured), the same path with the buffer off
# stays under 1.2 (x-accel-buffering-fix). Without one a busy machine merges a smooth
# stream's flushes into bursts of up to ~5 tokens (measured: the library on 2 shared
# cores), so only 8 or more is called lumpy then: a hop outside the path.
LUMPY_TOKENS_PER_BURST = 3.0
LUMPY_WITHOUT_A_BUFFERING_FAULT = 8.0
BUFFERING_FAULTS = ("proxy_buffering", "coalescer", "gzip_encoding", "buffer_whole_response")
# The fix for a buffering hop: nginx's knobs (the header or proxy_buffering off) for most;
# a hop that holds the whole answer and sends it with a length (lighttpd's default,
# server.stream-response-body = 0) reads no X-Accel-Buffering header.
BUFFERING_FIX = "fix: X-Accel-Buffering: no or proxy_buffering off"
WHOLE_ANSWER_FIX = (
    "fix: make that hop stream the body (lighttpd: server.stream-response-body = 2); "
    "X-Accel-Buffering: no does not reach it"
)
# Faults that delay the first byte: a late first text is theirs (without one, the gap
# between perceived and upstream TTFT is the client's own start and a loaded machine).
# They lump a stream too, not by buffering: what a handoff's outage, a slow link or a slow
# reader held back arrives together once the path moves again, and no X-Accel-Buffering
# or proxy_buffering setting changes that, so their lumps are not called a buffering hop.
DELAYING_FAULTS = ("latency", "link", "bandwidth", "slow_reader", "handoff")
# Perceived TTFT this much later than the upstream's own, and at least this ratio: a hop
# held the head of the stream (a buffer, a slow path), not the model.
LATE_FIRST_TOKEN_MS = 100.0
LATE_FIRST_TOKEN_RATIO = 2.0
# Bytes of one chat.completion.chunk SSE event on the wire (id, created, model, choices:
# about 270 in vLLM's and the emulator's streams), to turn tokens per burst into the size
# of the buffer that held them: nginx's 4 KiB proxy_buffer_size holds ~15 tokens.
BYTES_PER_TOKEN_EVENT = 270

# A few tokens generated after the client's close are normal: the abort lands about one
# inter-token interval later (vLLM checks for a disconnect between decoding steps).
WASTE_WORTH_NAMING = 3
# Faults that end the client's stream themselves and may leave the upstream's response
# running (`cut` toward the client only, or `hang`): the client never left, so the waste
# after that end is the path's, not a client close that failed to reach the model.
STREAM_ENDING_FAULTS = ("cut",)
# Faults that are the client leaving (a vanished client, a close the path swallows): waste
# after them is a close that never reached the model, even beside a stream-ending fault.
CLIENT_LEAVING_FAULTS = ("client_vanish", "ignore_client_close")
PATH_ENDED_WHY = (
    "the path ended the client's stream and kept the upstream's response running, so the "
    "model went on for nobody though the client never left"
)
PATH_ENDED_FIX = (
    "fix: a hop that ends a client's stream closes its upstream connection too (nginx "
    "closes the upstream when it finalizes a request early; vLLM aborts on the disconnect)"
)


@dataclass(frozen=True)
class Explanation:
    """Why a check on one metric fails, and the usual fix."""

    why: str
    fix: str


# Per metric: what a failed check on it means and what usually fixes it. Metric names are
# scenario/expect.py's METRICS, which run/score.py computes.
EXPLAIN: dict[str, Explanation] = {
    "client.silent_truncations": Explanation(
        "the stream ended without finish_reason or [DONE] (a Responses stream without "
        "response.completed, a Messages one without stop_reason and message_stop) and the "
        "client reported success with text missing",
        "treat a stream that ends without finish_reason or data: [DONE] (response.completed; "
        "message_stop) as an error (then retry or resume)",
    ),
    "client.complete": Explanation(
        "fewer requests showed exactly the text the upstream generated",
        "see the request verdicts: what was missing, duplicated or garbled",
    ),
    "client.truncations_detected": Explanation(
        "streams were cut short (the client surfaced an error)",
        "retry or resume a cut stream (Last-Event-ID) instead of giving up",
    ),
    "client.errors_reported": Explanation(
        "requests produced no text and surfaced an error",
        "retry with backoff when the error is transient (429, 502, 503)",
    ),
    "client.duplicated": Explanation(
        "the shown text repeats tokens: a retry or resume replayed text already shown",
        "on a restart discard what was shown, or resume with Last-Event-ID (a background "
        "response: responses.retrieve(id, stream=True, starting_after=<last shown>))",
    ),
    "client.sequence_gaps": Explanation(
        "a resume of a background response skipped events: starting_after was past the last "
        "sequence_number the client had",
        "resume with starting_after = the last sequence_number the client really showed",
    ),
    "client.sequence_repeats": Explanation(
        "a resume of a background response sent events again: starting_after was before the "
        "last sequence_number the client had",
        "resume with starting_after = the last sequence_number shown, and skip any event at "
        "or before it",
    ),
    "client.contradicted": Explanation(
        "a retry drew a different answer and the client showed it over text already read",
        "resume with Last-Event-ID, or send a seed, or discard what was shown on a restart",
    ),
    "client.complete_then_error": Explanation(
        "the whole answer was shown, then the client surfaced an error (a reset, not a clean "
        "close, ended the stream)",
        "keep an answer whose finish_reason arrived: an error after it need not discard or "
        "retry it",
    ),
    "client.missing_tokens": Explanation(
        "the shown text lacks tokens in the middle: events were dropped or a resume skipped ahead",
        "resume from the last event id the client really showed",
    ),
    "client.mojibake": Explanation(
        "U+FFFD in the shown text: bytes were decoded per read and a multi-byte "
        "character split across reads",
        "decode with an incremental UTF-8 decoder over the whole stream",
    ),
    "client.hangs": Explanation(
        "no result within the workload timeout: the client waited on a silent stream",
        "give the client a read timeout (stall detection) and surface it",
    ),
    "client.abandoned": Explanation(
        "the client did not abandon the requests it was told to",
        "close the connection when the user gives up",
    ),
    "client.resumed": Explanation(
        "the client did not reconnect with Last-Event-ID as expected",
        "keep the last SSE id and send it as Last-Event-ID on reconnect",
    ),
    "client.retries": Explanation(
        "the client made a different number of HTTP attempts than expected",
        "retry with capped exponential backoff and honour Retry-After",
    ),
    "client.amplification": Explanation(
        "one logical request ran several generations upstream (retries re-ran the model)",
        "resume instead of restarting, back off, and cap retries",
    ),
    "client.perceived_ttft_ms": Explanation(
        "the first text reached the user late",
        "find the hop that holds the head of the stream (buffering, slow path)",
    ),
    "client.itl_ms": Explanation(
        "gaps between shown pieces are long", "look for a buffering or slow hop"
    ),
    "client.largest_gap_ms": Explanation(
        "the user waited a long time between two pieces of text",
        "look for a buffering hop or a stall upstream",
    ),
    "client.bursts": Explanation(
        "the text arrived in a different number of lumps than expected",
        "X-Accel-Buffering: no from the server, or proxy_buffering off in nginx",
    ),
    "client.tokens_per_burst": Explanation(
        "the text arrived at a different lumpiness than expected (1 = one token per flush)",
        "X-Accel-Buffering: no from the server, or proxy_buffering off in nginx",
    ),
    "client.stall_detect_ms": Explanation(
        "the client took long to notice a stalled stream",
        "a shorter read timeout between events (heartbeats keep it quiet)",
    ),
    "server.generations": Explanation(
        "the upstream ran a different number of generations than expected",
        "retries and resumes re-run the model: check the client's retry policy",
    ),
    "server.tokens_generated": Explanation(
        "the upstream generated a different number of tokens than expected",
        "check max_tokens and whether generation stopped when the client left",
    ),
    "server.tokens_wasted": Explanation(
        "tokens were generated after the client had gone: its close never reached the model",
        "propagate the client's close to the upstream (nginx: proxy_ignore_client_abort "
        "off; vLLM aborts on disconnect)",
    ),
    "server.background_left_running": Explanation(
        "a background Responses response outlives its connection by design: nobody cancelled "
        "it, so it generated the rest of its answer for nobody",
        "cancel it when the user leaves (POST /v1/responses/{id}/cancel), and resume a broken "
        "stream (GET /v1/responses/{id}?stream=true&starting_after=N) instead of creating it "
        "again",
    ),
    "server.aborted": Explanation(
        "the upstream did not abort the generations whose client left",
        "the proxy must close the upstream connection when the client goes",
    ),
    "server.abort_latency_ms": Explanation(
        "the abort reached the upstream late after the client left",
        "a hop noticed the client's close late: check its broken-connection detection",
    ),
    "server.heartbeats": Explanation(
        "the upstream sent a different number of SSE keep-alive comments than expected",
        "send `: ping` comments while idle so intermediaries' idle timeouts stay quiet",
    ),
    "server.usage_reported": Explanation(
        "responses lacked a usage object", "ask with stream_options: {include_usage: true}"
    ),
    "server.inband_errors": Explanation(
        'a different number of data: {"error": ...} frames than expected',
        "surface in-band error frames to the user",
    ),
    "server.x_accel_buffering_no": Explanation(
        "responses did not send X-Accel-Buffering: no",
        "send X-Accel-Buffering: no on event streams (nginx then streams them)",
    ),
    # agent streams (run/agent_checks.py)
    "client.partial_tool_calls_executed": Explanation(
        "the client ran a tool call whose arguments were not the complete JSON the model sent",
        "run a call only after the stream's finish_reason and once its arguments parse",
    ),
    "client.side_effects_repeated": Explanation(
        "the client ran one tool call again on a retry without the same idempotency key",
        "send one idempotency key per logical call and do not retry a turn whose calls ran",
    ),
    "client.invalid_json_acted_on": Explanation(
        "the client acted on JSON that was cut or repaired, not the model's whole answer",
        "act on a JSON answer only after its finish_reason and once it parses",
    ),
    "client.reasoning_as_answer": Explanation(
        "the client showed the model's reasoning as its answer",
        "show delta.reasoning apart from delta.content (or not at all)",
    ),
    "client.reasoning_hidden": Explanation(
        "the model streamed reasoning the client never showed: the user waited with nothing "
        "on screen",
        "show the reasoning (or a 'thinking' state) while it streams",
    ),
    "server.upstream_ttft_ms": Explanation(
        "the upstream itself was slow to its first token", "look at the model server's queue"
    ),
}

# Attempts a hop answered (a 429 with Retry-After, an error page) before any reached the
# model cost the path and the user's wait, not the GPU: "re-ran the model" would be false
# there (server.generations_per_request says how many generations ran).
HOP_ANSWERED_ATTEMPTS = Explanation(
    "the extra attempts were answered by a hop (a 429, an error) before they reached the "
    "model, which ran once at most",
    "honour Retry-After, back off, and cap retries",
)

AGENT_VERDICT_METRICS = {
    "acted_on_partial_call": "client.partial_tool_calls_executed",
    "side_effect_repeated": "client.side_effects_repeated",
    "acted_on_invalid_json": "client.invalid_json_acted_on",
    "reasoning_as_answer": "client.reasoning_as_answer",
    "reasoning_hidden": "client.reasoning_hidden",
}
UNKNOWN = Explanation("the metric did not meet the expectation", "see the scenario's description")


def _median(values: Any) -> float | None:
    if isinstance(values, list):
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        return statistics.median(numbers) if numbers else None
    return float(values) if isinstance(values, int | float) else None


def _largest(values: Any) -> float | None:
    if isinstance(values, list):
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        return max(numbers) if numbers else None
    return float(values) if isinstance(values, int | float) else None


@dataclass(frozen=True)
class Symptoms:
    """The numbers that name a symptom, for one scenario-client run (None = not measured)."""

    perceived_ttft_ms: float | None
    upstream_ttft_ms: float | None
    tokens_per_burst: float | None
    upstream_tokens_per_burst: float | None
    largest_gap_ms: float | None
    attempts: int
    requests: int
    tokens_wasted: int
    abort_latency_ms: float | None


def symptoms(result: dict[str, Any]) -> Symptoms:
    metrics: dict[str, Any] = result.get("metrics") or {}
    requests = result.get("requests") or []
    bursts = metrics.get("client.bursts") or 0
    return Symptoms(
        perceived_ttft_ms=_median(metrics.get("client.perceived_ttft_ms")),
        upstream_ttft_ms=_median(metrics.get("server.upstream_ttft_ms")),
        tokens_per_burst=float(metrics["client.tokens_per_burst"])
        if bursts and isinstance(metrics.get("client.tokens_per_burst"), int | float)
        else None,
        upstream_tokens_per_burst=_median(metrics.get("server.tokens_per_burst")),
        largest_gap_ms=float(metrics["client.largest_gap_ms"])
        if bursts and isinstance(metrics.get("client.largest_gap_ms"), int | float)
        else None,
        attempts=sum(int(request.get("attempts") or 0) for request in requests),
        requests=len(requests),
        tokens_wasted=int(metrics.get("server.tokens_wasted") or 0),
        abort_latency_ms=_largest(metrics.get("server.abort_latency_ms")),
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _per_burst(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def figures(found: Symptoms) -> dict[str, str]:
    """The symptom numbers as short table cells, in the scorecard's column order."""
    return {
        "ttft ms": f"{_ms(found.perceived_ttft_ms)}/{_ms(found.upstream_ttft_ms)}",
        "tok/burst": _per_burst(found.tokens_per_burst)
        + "/"
        + _per_burst(found.upstream_tokens_per_burst),
        "gap ms": _ms(found.largest_gap_ms),
        "attempts": f"{found.attempts}/{found.requests}",
        "wasted": str(found.tokens_wasted),
        "abort ms": _ms(found.abort_latency_ms),
    }


FIGURE_LEGEND = (
    "ttft ms = the user's first text (median) / the upstream's own first token; tok/burst = "
    "upstream tokens per flush the client saw / per burst the upstream made them in (1 = "
    "smooth; only tokens made while the client was there); gap ms = largest wait between "
    "pieces; attempts = HTTP attempts / logical requests; wasted = tokens generated after "
    "the client left; abort ms = client gone -> upstream aborted"
)


def _fired(result: dict[str, Any]) -> set[str]:
    fired = (result.get("verdicts") or {}).get("faults_fired") or []
    return {str(entry).split(":")[0] for entry in fired}


@dataclass(frozen=True)
class Finding:
    """One symptom of a run: `text`, the whole of it as the diagnosis line says it;
    `name`, its short form with this run's numbers (the terminal table's cell); `key`,
    what every run with this symptom has in common, why and the fix (said once under the
    table), or "" when the name says it all."""

    name: str
    text: str
    key: str = ""


def _named(name: str, metric: str) -> Finding:
    """A symptom whose why and fix are a metric's: the same for every run."""
    said = f"{name}: {_said(metric)}"
    return Finding(name, said, said)


def findings(result: dict[str, Any]) -> list[Finding]:
    """Every symptom of one run, worst first: its likely cause and the usual fix."""
    verdicts: list[str] = (result.get("verdicts") or {}).get("requests") or [
        request.get("verdict", "") for request in result.get("requests") or []
    ]
    found = symptoms(result)
    fired = _fired(result)
    metrics: dict[str, Any] = result.get("metrics") or {}
    out: list[Finding] = []
    if "upstream_error" in verdicts:
        refused = {request.get("upstream_status") for request in result.get("requests") or []}
        said = " and ".join(f"HTTP {status}" for status in sorted(refused - {None}))
        name = f"the upstream answered {said or 'an HTTP error'}"
        key = f"the upstream answered an HTTP error: {UPSTREAM_REFUSED}"
        out.append(Finding(name, f"{name}: {UPSTREAM_REFUSED}", key))
    if "no_result" in verdicts:
        out.append(Finding("no result", f"no result: {NO_RESULT}", f"no result: {NO_RESULT}"))
    for verdict, name, metric in TEXT_DAMAGE:
        if verdict in verdicts:
            out.append(_named(name, metric))
    for verdict, metric in AGENT_VERDICT_METRICS.items():
        if verdict in verdicts:
            out.append(_named(verdict.replace("_", " "), metric))
    # amplification counts attempts on the wire; how many of them the model actually ran
    # is server.generations_per_request (a 429 answered by a hop runs nothing)
    amplification = int(metrics.get("client.amplification") or 0)
    generations = metrics.get("server.generations_per_request")
    resumed = int(metrics.get("client.resumed") or 0)
    # a resume (Last-Event-ID, or a Responses `starting_after`) reads the same generation on
    # from where it broke: its attempts ran the model once, which is the fix, not the fault
    resumed_one_generation = (
        resumed > 0 and isinstance(generations, int | float) and generations <= 1
    )
    if amplification > 1 and not resumed_one_generation:
        ran = (
            f"the model ran {int(generations)}"
            if isinstance(generations, int | float)
            else "each may re-run the model"
        )
        name = f"{amplification} attempts for one request ({ran})"
        ran_once_at_most = isinstance(generations, int | float) and generations <= 1
        explained = HOP_ANSWERED_ATTEMPTS if ran_once_at_most else EXPLAIN["client.amplification"]
        fix = explained.fix
        key = f"attempts for one request: {explained.why}; fix: {fix}"
        out.append(Finding(name, f"{name}; fix: {fix}", key))
    hop = next((f for f in BUFFERING_FAULTS if f in fired), "")
    lumpy = LUMPY_TOKENS_PER_BURST if hop else LUMPY_WITHOUT_A_BUFFERING_FAULT
    delaying = [f for f in DELAYING_FAULTS if f in fired]
    # the path's lumps where the journal saw them at the client's socket, else the client's
    delivered = metrics.get("client.delivered_tokens_per_burst")
    per_burst = float(delivered) if isinstance(delivered, int | float) else found.tokens_per_burst
    if (
        found.tokens_per_burst is not None  # the client saw bursts
        and per_burst is not None
        and lumpy_by_a_hop(per_burst, metrics, lumpy)
        and (hop or not delaying)
    ):
        lump = per_burst * BYTES_PER_TOKEN_EVENT / 1024
        name = f"~{per_burst:.0f}-token (~{lump:.0f} KiB) lumps: a buffering hop"
        name += f" ({hop})" if hop else ""
        fix = WHOLE_ANSWER_FIX if hop == "buffer_whole_response" else BUFFERING_FIX
        key = (
            "a buffering hop: the client saw the upstream's tokens in fewer, bigger bursts "
            f"than the upstream made them; {fix}"
        )
        out.append(Finding(name, f"arrived in {name}; {fix}", key))
    elif (
        delaying
        and found.attempts <= found.requests  # a retry's TTFT counts from the first attempt
        and found.perceived_ttft_ms is not None
        and found.upstream_ttft_ms is not None
        and found.perceived_ttft_ms - found.upstream_ttft_ms > LATE_FIRST_TOKEN_MS
        and found.perceived_ttft_ms > LATE_FIRST_TOKEN_RATIO * found.upstream_ttft_ms
    ):
        late = found.perceived_ttft_ms - found.upstream_ttft_ms
        slow = f"a slow hop ({', '.join(delaying)})"
        out.append(
            Finding(
                f"first text {late:.0f} ms late: {slow}",
                f"first text {late:.0f} ms after the upstream's first token: {slow} holds the "
                "head of the stream",
                "first text late: a slow hop (a fault that delays the path) holds the head of "
                "the stream, not the model",
            )
        )
    left_running = int(metrics.get("server.background_left_running") or 0)
    if found.tokens_wasted > WASTE_WORTH_NAMING and left_running:
        # vLLM runs a background response as a task of its own: no close stops it, by design
        name = f"a background response left running: {found.tokens_wasted} tokens for nobody"
        said = _said("server.background_left_running")
        key = f"a background response left running: {said}"
        out.append(Finding(name, f"{name}: {said}", key))
    elif found.tokens_wasted > WASTE_WORTH_NAMING and _path_ended_the_stream(verdicts, fired):
        ending = ", ".join(f for f in STREAM_ENDING_FAULTS if f in fired)
        name = f"{found.tokens_wasted} tokens generated after the path ended the stream ({ending})"
        key = (
            f"tokens generated after the path ended the stream: {PATH_ENDED_WHY}; {PATH_ENDED_FIX}"
        )
        out.append(Finding(name, f"{name}: {PATH_ENDED_WHY}; {PATH_ENDED_FIX}", key))
    elif found.tokens_wasted > WASTE_WORTH_NAMING:
        name = f"{found.tokens_wasted} tokens generated for nobody"
        said = _said("server.tokens_wasted")
        out.append(Finding(name, f"{name}: {said}", f"tokens generated for nobody: {said}"))
    if not out and resumed_one_generation and set(verdicts) <= {"complete", "abandoned"}:
        name = f"cut, and resumed {resumed} time{'s' if resumed > 1 else ''}: one generation"
        out.append(Finding(name, name))
    if not out and "truncation_detected" in verdicts:
        name = "cut short, and the client said so"
        said = f"{name}: {EXPLAIN['client.truncations_detected'].fix}"
        out.append(
            Finding(name, said, f"{name}: fix: {EXPLAIN['client.truncations_detected'].fix}")
        )
    if not out and "error_reported" in verdicts:
        said = "failed, and the client said so (no text shown)"
        out.append(Finding(said, said))
    if not out and "complete_then_error" in verdicts:
        out.append(_named("whole answer, then an error", "client.complete_then_error"))
    if not out and verdicts and set(verdicts) <= {"complete", "abandoned"}:
        said = "healthy: complete" + (", abandoned on purpose" if "abandoned" in verdicts else "")
        out.append(Finding(said, said))
    return out


def _path_ended_the_stream(verdicts: list[str], fired: set[str]) -> bool:
    """Whether the path, not the client, ended the stream the upstream went on generating
    for: a fault that ends the client's stream fired, and no client left on its own (an
    abandoned request, a vanished client, a swallowed close)."""
    if "abandoned" in verdicts or fired & set(CLIENT_LEAVING_FAULTS):
        return False
    return bool(fired & set(STREAM_ENDING_FAULTS))


UPSTREAM_REFUSED = (
    "the server itself refused (its status is on the upstream leg of the journal), not the "
    "client or a fault, so nothing was streamed to judge the client by; fix: check that the "
    "upstream serves the OpenAI API for the model its /v1/models names (--upstream)"
)
NO_RESULT = (
    "the client ended without a result the scorer can read: none, or one that breaks the "
    "client contract (the run's problem line names what); fix: write the result file "
    "docs/clients.md describes"
)
# Verdicts that damaged the text, worst first: the name the diagnosis gives each and the
# metric whose why and fix it says.
TEXT_DAMAGE = (
    ("hang", "hung", "client.hangs"),
    ("silent_truncation", "silent truncation", "client.silent_truncations"),
    ("mojibake", "mojibake", "client.mojibake"),
    ("duplicated", "duplicated text", "client.duplicated"),
    ("contradicted", "answer redrawn", "client.contradicted"),
    ("missing_tokens", "tokens missing", "client.missing_tokens"),
)
# Per verdict, the metric that counts it: an `expect:` check on it pins that verdict.
VERDICT_METRICS: dict[str, str] = {
    **{verdict: metric for verdict, _, metric in TEXT_DAMAGE},
    **AGENT_VERDICT_METRICS,
    "truncation_detected": "client.truncations_detected",
    "error_reported": "client.errors_reported",
    "complete_then_error": "client.complete_then_error",
    "abandoned": "client.abandoned",
    "complete": "client.complete",
}
SHOWN_FINDINGS = 2
"""A diagnosis names the two worst symptoms of a run."""


def diagnose(result: dict[str, Any]) -> str:
    """One line: the worst symptoms in this run, their likely cause and the usual fix."""
    named = findings(result)[:SHOWN_FINDINGS]
    return "; ".join(finding.text for finding in named) if named else "-"


def lumpy_by_a_hop(per_burst: float, metrics: dict[str, Any], lumpy: float) -> bool:
    """The client saw `lumpy` times more tokens per burst (`per_burst`) than the upstream
    made per burst (`server.tokens_per_burst`; 1 when not measured): a hop merged the
    upstream's flushes. Only tokens generated while the client was there count (the
    scorer's rule), so an upstream that went on generating for nobody lumps nothing."""
    own = metrics.get("server.tokens_per_burst")
    floor = max(float(own), 1.0) if isinstance(own, int | float) else 1.0
    return per_burst >= lumpy * floor


def _said(metric: str) -> str:
    explanation = EXPLAIN[metric]
    return f"{explanation.why}; fix: {explanation.fix}"


_FIX_SENTENCE = re.compile(r"[^.]*\b(?:fix|fixes|fixed)\b[^.]*\.?", re.IGNORECASE)


def description_fix(description: str) -> str | None:
    """The sentence of a scenario's description that names the fix, if it has one."""
    text = " ".join(description.split())
    match = _FIX_SENTENCE.search(text)
    return match.group(0).strip() if match else None


def hint_for(scenario: dict[str, Any], client: str, metric: str) -> str | None:
    """The scenario's `hint:` for this check: the client's own block first."""
    hints: dict[str, str] = scenario.get("hints") or {}
    return hints.get(f"{client}/{metric}") or hints.get(metric)


def why_and_fix(scenario: dict[str, Any], client: str, check: dict[str, Any]) -> tuple[str, str]:
    """Why a failed check failed and what to do: the scenario's hint, else the sentence of
    its description that names a fix, else the usual fix for that metric."""
    explanation = EXPLAIN.get(str(check.get("name")), UNKNOWN)
    fix = (
        hint_for(scenario, client, str(check.get("name")))
        or description_fix(str(scenario.get("description") or ""))
        or explanation.fix
    )
    return explanation.why, fix


def check_said(check: dict[str, Any]) -> str:
    """A check as a line: `name condition expected: got actual`, and how it was judged
    when not as written (a real server's decoding time: middlebox.run.suite)."""
    said = f"{check['name']} {check['condition']} {check['expected']}: got {check['actual']}"
    return f"{said} ({check['note']})" if check.get("note") else said


def failure_message(scenario: dict[str, Any], client: str, check: dict[str, Any]) -> str:
    """A failed check in one line: what, why and what to do."""
    why, fix = why_and_fix(scenario, client, check)
    return f"{check_said(check)}; why: {why}; fix: {fix}"
