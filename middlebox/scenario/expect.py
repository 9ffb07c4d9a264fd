"""The `expect:` block of a scenario: the metrics it may check, their conditions, and where
each name stands in the file.

The scorer (`run/score.py`, `run/agent_checks.py`) computes these metrics per client; their
names are part of the scenario format, so the loader places a misspelled metric or condition
at its line and column (with did-you-mean), as it does a misspelled fault, and `validate`
refuses it before any run. A rule is `metric: value` (equals), `metric: {condition: value,
hint: ...}`, or a `CLIENT: {metric: ...}` block for one client. Which clients exist only a
run knows (the built-in ones and its `--client-cmd NAME=...`): the loader records where each
block's name stands, and `client_problems` places one that names no client of the run.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TypeGuard

import yaml

from middlebox.scenario.convert import Converter, Invalid, Problem, did_you_mean
from middlebox.scenario.model import Scenario

AGENT_METRICS: dict[str, str] = {
    "client.tool_calls_executed": "tool calls the client reported executing, summed",
    "client.partial_tool_calls_executed": "tool calls executed with arguments that are not the "
    "complete arguments the upstream sent, or not valid JSON",
    "client.side_effects_repeated": "extra executions of one logical tool call without one "
    "idempotency key for all (a retried side effect: an email sent twice)",
    "client.invalid_json_acted_on": "JSON documents acted on that do not parse or are not the "
    "complete JSON answer the upstream sent",
    "client.reasoning_as_answer": "requests whose shown answer contains the upstream's "
    "reasoning text",
    "client.reasoning_hidden": "requests whose upstream streamed reasoning the client never "
    "showed (the user waited without being told)",
    "client.reasoning_ttft_ms": "time from request start to the first shown reasoning piece "
    "(list; compare client.perceived_ttft_ms)",
    "server.tool_call_tokens_wasted": "tool-call argument fragments the upstream sent that "
    "never reached the client (generated after a cut)",
}

METRICS: dict[str, str] = {
    "client.requests": "logical requests the client was asked to make",
    "client.complete": "requests whose shown text equals what the upstream generated",
    "client.complete_then_error": "requests whose whole answer was shown, then an error "
    "surfaced (a real app may discard or retry it)",
    "client.silent_truncations": "requests reported as successful with text missing",
    "client.truncations_detected": "requests cut short where the client surfaced an error",
    "client.errors_reported": "requests that produced no text and surfaced an error",
    "client.duplicated": "requests whose shown text repeats tokens (a bad resume or retry)",
    "client.missing_tokens": "requests whose shown text lacks tokens in the middle",
    "client.mojibake": "requests whose shown text has U+FFFD the upstream never sent",
    "client.contradicted": "requests whose answer contradicts text already shown (a retry "
    "redrew or spliced a differently sampled answer)",
    "client.hangs": "requests with no result within the workload timeout",
    "client.abandoned": "requests the client abandoned on purpose",
    "client.resumed": "reconnects with Last-Event-ID",
    "client.retries": "HTTP attempts beyond the first, summed (counted on the wire)",
    "client.amplification": "HTTP attempts per logical request, counted on the wire, "
    "those a fault answered included (largest)",
    "client.attempts_mismatch": "requests whose self-reported attempts differ from the wire",
    "client.length_hidden": "requests cut by max_tokens whose finish_reason length reached "
    "the client, which did not report it as length",
    "client.stop_invented": "requests the client reported as finish_reason stop where no "
    "stop reached it",
    "client.sequence_gaps": "Responses events the client was never sent between two it was "
    "sent, over a response's create and resume legs (a resume with starting_after past the "
    "last event it had), summed",
    "client.sequence_repeats": "Responses events sent to the client again on a resume (a "
    "starting_after before the last event it had), summed: duplicated text unless the "
    "client skips them",
    "client.perceived_ttft_ms": "time from request start to the first shown text (list)",
    "client.itl_ms": "gaps between shown pieces (list)",
    "client.largest_gap_ms": "the longest wait between two shown pieces",
    "client.bursts": "groups of pieces shown within 10 ms of each other, summed",
    "client.tokens_per_burst": "upstream tokens per burst the client saw (1 = smooth), of "
    "those generated while it was there",
    "client.delivered_tokens_per_burst": "token chunks per burst as the path delivered them "
    "to the client's socket (the client leg of the journal), the client's own reading apart",
    "client.stall_detect_ms": "time from the last shown piece to a surfaced error (list)",
    "server.generations": "generations the upstream ran",
    "server.generations_per_request": "upstream generations per logical request (largest)",
    "server.tokens_generated": "tokens the upstream generated",
    "server.tokens_wasted": "tokens generated after the client had gone (ledger, or token "
    "times after the client stopped reading); a background Responses response only what "
    "reached no client: after the user gave up without a cancel, after a cancel, or left "
    "running by a restart, never what a resume read",
    "server.background_left_running": "background Responses responses that generated for "
    "nobody, neither read to their end nor cancelled (left by a user who gave up, or by a "
    "client that created the response again)",
    "server.aborted": "generations aborted because the client left (a background Responses "
    "response: by its cancel)",
    "server.abort_latency_ms": "time from the client leaving (or the cancel) to the abort (list)",
    "server.heartbeats": "SSE comment lines (keep-alives) the upstream sent",
    "server.usage_reported": "responses whose stream carried a usage object",
    "server.inband_errors": 'data: {"error": ...} frames the upstream sent',
    "server.x_accel_buffering_no": "responses that sent X-Accel-Buffering: no",
    "server.upstream_ttft_ms": "the upstream's own time to first token (list)",
    "server.ms_per_token": "a real upstream's decoding pace while the run's requests ran, "
    "from its token counter (--upstream only: wasted-token bounds are judged at it)",
    "server.chunks_per_burst": "a real upstream's token chunks per burst at the proxy (the "
    "10 ms rule on the upstream leg; --upstream only): what the path's delivery to the "
    "client's socket (client.delivered_tokens_per_burst) is judged against",
    "server.tokens_per_burst": "the upstream's own lumps: its tokens per burst by the same "
    "10 ms rule (the emulator's token times; a real server's frames at the proxy): a client "
    "cannot see a stream smoother than this",
    **AGENT_METRICS,  # tool calls, JSON answers, reasoning (judged by run/agent_checks.py)
}

CONDITIONS = ("max", "min", "equals", "mean_max", "p50_max", "p95_max", "p99_max")

EXPECT_CLIENTS = "expect_clients"
"""The `sections` key holding where each `CLIENT:` block of `expect:` names its client:
(line, column) by name, for `client_problems`."""


def check_expect(node: yaml.Node, convert: Converter) -> dict[str, tuple[int, int]]:
    """Record, at its node, every unknown metric or condition of an `expect:` block and every
    bound that is not a number or true/false; return where each `CLIENT:` block's name stands."""
    if isinstance(node, yaml.ScalarNode) and convert.scalar(node) is None:
        return {}
    if not isinstance(node, yaml.MappingNode):
        convert.problems.add(node, "expect: expected a mapping of metric names to rules")
        return {}
    clients: dict[str, tuple[int, int]] = {}
    for name_node, rule_node in convert.mapping_pairs(node, "expect"):
        name = name_node.value
        if name not in METRICS and is_client_block(rule_node):
            clients[name] = (name_node.start_mark.line + 1, name_node.start_mark.column + 1)
            for metric_node, rule in convert.mapping_pairs(rule_node, f"expect: {name}"):
                check_rule(metric_node, rule, f"expect: {name}: ", convert)
        else:
            check_rule(name_node, rule_node, "expect: ", convert)
    return clients


def is_client_block(node: yaml.Node) -> TypeGuard[yaml.MappingNode]:
    """A client's block holds metrics (`client.x`, `server.y`); a rule holds conditions."""
    return isinstance(node, yaml.MappingNode) and any(
        "." in str(getattr(key, "value", "")) for key, _ in node.value
    )


def check_rule(name_node: yaml.Node, rule_node: yaml.Node, where: str, convert: Converter) -> None:
    name = name_node.value
    if name not in METRICS:
        convert.problems.add(
            name_node,
            f"{where}unknown metric {name!r}{did_you_mean(name, METRICS)}; valid metrics: "
            + ", ".join(METRICS),
        )
        return
    if not isinstance(rule_node, yaml.MappingNode):
        check_bound(rule_node, f"{where}{name}", convert)
        return
    for condition_node, bound_node in convert.mapping_pairs(rule_node, f"{where}{name}"):
        condition = condition_node.value
        if condition == "hint":  # its text is checked where hints are split off (load.py)
            continue
        if condition not in CONDITIONS:
            convert.problems.add(
                condition_node,
                f"{where}{name}: unknown condition {condition!r}"
                f"{did_you_mean(condition, dict.fromkeys(CONDITIONS))}; valid conditions: "
                f"{', '.join(CONDITIONS)} (and hint)",
            )
            continue
        check_bound(bound_node, f"{where}{name}: {condition}", convert)


def check_bound(node: yaml.Node, what: str, convert: Converter) -> None:
    """A bound is compared with a count, a time or a flag: a number or true/false."""
    try:
        convert.convert(node, float | bool, what)
    except Invalid:
        pass


def client_problems(scenario: Scenario, clients: Collection[str]) -> list[Problem]:
    """Each `CLIENT:` block of `expect:` that names none of `clients`, where its name stands."""
    named: dict[str, tuple[int, int]] = scenario.sections.get(EXPECT_CLIENTS) or {}
    return [
        Problem(
            scenario.source,
            line,
            column,
            f"expect: {name!r} names no client{did_you_mean(name, dict.fromkeys(clients))}; "
            f"clients: {', '.join(sorted(clients))} (a block for your own client needs "
            f"`--client-cmd {name}=COMMAND` when it runs)",
        )
        for name, (line, column) in named.items()
        if name not in clients
    ]
