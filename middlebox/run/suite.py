"""`middlebox run`: start the upstream, a proxy per client and the clients; then score.

For each scenario: the embedded emulator is started in its own process with the
scenario's `upstream:` block (unless `--upstream` points at a real server); each client
under test runs with its own proxy (`middlebox.run.client_runs`); then the upstream's
ledger, the proxy journals and the client results are scored. Everything started here is
stopped here, by the handle it was started with. Scenarios run `jobs` at a time in one
trio loop; the report directory gets report.json, junit.xml and report.html.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import shutil
import signal
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import trio

from middlebox.clients import BUILTIN_CLIENTS, DIALECT_CLIENTS, SCENARIO_CLIENTS
from middlebox.compose import expand_paths, load
from middlebox.core.stream import Direction
from middlebox.library import library_name, scenario_dir
from middlebox.observe.journal import ConnectionJournal, fault_proof
from middlebox.observe.requests import arrivals, ledger_for
from middlebox.report.layout import run_directory
from middlebox.report.progress import Progress
from middlebox.report.scorecard import write_reports
from middlebox.run.agent_checks import fragments_read_after_the_client_stopped
from middlebox.run.client_runs import (
    ClientRun,
    ClientSpec,
    default_clients,
    resolve_clients,
    run_client,
)
from middlebox.run.context_plan import prompt_token_bound, within_context
from middlebox.run.outcome import (
    Interrupted,
    RunError,
    ScenarioOutcome,
    SuiteOutcome,
    UsageError,
)
from middlebox.run.processes import (
    CHILDREN,
    Children,
    UpstreamStartError,
    emulator_config,
    start_emulator,
)
from middlebox.run.processes import stop_upstream as stop_emulator
from middlebox.run.score import (
    DELIVERED_TOKENS_PER_BURST,
    SERVER_TOKENS_PER_BURST,
    Check,
    ClientScore,
    UpstreamExchange,
    delivered_token_times,
    delivered_tokens_per_burst,
    evaluate_expect,
    exchanges_of,
    real_server_metrics,
    response_answers,
    score_client,
    server_metrics,
    split_replays,
    upstream_problem,
)
from middlebox.run.sessions import other_session_warning
from middlebox.run.takes import (
    Disturbance,
    LoopLag,
    Take,
    server_stall,
    taken,
    watching_loop_lag,
)
from middlebox.run.upstream import (
    UpstreamClient,
    UpstreamError,
    acontext,
    akeeps_background_responses,
    amodel,
    apace,
    sampled,
    settled_ledger,
)
from middlebox.scenario.expect import client_problems
from middlebox.scenario.model import Scenario
from middlebox.scenario.workload import Workload
from middlebox.shell.server import Address

log = logging.getLogger("middlebox.run.suite")

# ------------------------------------------------- what only the emulator can do

IMITATION_FIELDS = frozenset(
    {
        "profile", "model", "seed", "prefill_overhead", "prefill_per_token", "itl",
        "itl_jitter", "batch_slowdown", "natural_length_min", "natural_length_max",
        "default_max_tokens", "created", "system_fingerprint", "log_requests",
        "http_keep_alive_timeout", "resume_buffer_size", "resume_ttl", "fail_kind", "cpu_flags",
        "responses_store",
    }
)  # fmt: skip
"""`EmulatorConfig` fields that tune how the emulator imitates a server (its speed, its
wire profile, its ids, the details of a behaviour switched on elsewhere): a real server
has its own, so against one they are not in play. Every other field, set away from its
default (the defaults are what vLLM does), asks for behaviour that only the emulator
has, so the list of what needs the emulator is derived from the config's fields: a
field added to `EmulatorConfig` needs the emulator until it is named here.
`responses_store` is a real vLLM's own switch (VLLM_ENABLE_RESPONSES_API_STORE=1, which
`make vllm` sets): against a real server it is checked, not emulated (`store_problem`)."""

WHY_EMULATOR = {
    "pauses": "a stall after N tokens (a real vLLM cannot be told to pause)",
    "sse_keep_alive_interval": "SSE heartbeats (vLLM sends no keep-alive comments)",
    "fail_after_tokens": "an in-band error after N tokens (a real vLLM fails on its own)",
    "resumable": "resumable streams (a gateway pattern vLLM lacks)",
    "cassette": "a recorded response replayed",
    "max_num_queued_reqs": "a queue bound the real server was not started with",
    "abort_on_disconnect": "a server that does not abort on disconnect (vLLM always aborts)",
    "script": "pinned output text",
    "reasoning_tokens": "a reasoning phase (the tier's model has no reasoning parser)",
    "tool_calls_per_response": "several tool calls in one answer (a model's own choice)",
}


REAL_BODY_EXTRA = {"ignore_eos": True}
"""Added to every request a real server gets: the emulator's answer to a `max_tokens`
request is exactly that long (the scenario's stream length), while a model stops at
its own EOS (the tier's random-weight model anywhere, often within 20 tokens, so an
abandoning client would see a complete answer instead). `ignore_eos` is vLLM's
sampling parameter for exactly `max_tokens` tokens. Not on a structured answer (see
`real_body_extra`)."""


def real_body_extra(workload: Workload) -> dict[str, Any]:
    """What a real server's requests get added: REAL_BODY_EXTRA, except where the answer is
    a tool call or a JSON document. Guided decoding closes those and then allows only the
    EOS; with `ignore_eos` vLLM 0.32 pads the closed JSON with whitespace to `max_tokens`
    and ends it `finish_reason: "length"` (measured on the tier's server: a named call's
    arguments `3422129e42878` then `length`; without it `stop`, as agents see it), so
    every call would be one `max_tokens` cut, which no correct client runs."""
    if workload.tools or workload.tool_choice or workload.response_format:
        return {}
    return dict(REAL_BODY_EXTRA)


MAX_PACED_TOKENS = 4000
"""The most tokens a paced workload asks for (the real tier's model serves 8192)."""
FRAME_MARGIN = 1.5
"""How many more frames' worth of tokens than measured a paced stream asks for (`paced`)."""
ABANDON_MARGIN = 5.0
"""Seconds an abandoning stream outlasts the scenario's against a real server (`paced`)."""
HOLD_MARGIN = 1.0
"""The same for an abandoning scenario that watches no abort nor waste (`watches_the_leave`)."""


def paced(
    workload: Workload,
    scenario: Scenario,
    seconds_per_token: float | None,
    tokens_per_frame: float = 1.0,
    *,
    margins: bool = True,
) -> Workload:
    """The workload against a real server, sized in time rather than tokens.

    A scenario's stream is as long as its `upstream:` timing makes it (`max_tokens`
    tokens at `itl` each): how long a proxy buffers it, when a client gives up, whether
    the server is still generating when the client leaves. A real server runs at its own
    speed (the tier's tiny model: ~2-5 ms a token, against the library's 10-15 ms), so
    the same token count would be over before a client that leaves after 20 tokens has
    left, and no abort could be seen. So `max_tokens` grows by the ratio of the two
    speeds, never shrinks; every token count scored is still the real server's.

    And as long in frames: a fault counts what the stream carries (a cut `after: tokens,
    count: 12` counts token-bearing events, one a token from the emulator), and a vLLM
    whose API server lags its engine merges several tokens into one frame
    (`tokens_per_frame`, measured with the pace): 40 tokens in 14 frames left a cut after
    12 unfired for one client in four (reset-mid-stream, clean-close-without-done). So the
    stream asks for the scenario's frames' worth of tokens at that rate, FRAME_MARGIN
    over it, since merging moves with the load between the measurement and the run.
    `margins=False`: the least the scenario needs, with neither margin (`context_plan`)."""
    block: Any = scenario.sections.get("upstream")
    itl = float(getattr(block, "itl", 0.0) or 0.0)
    if not seconds_per_token:
        return workload
    seconds = workload.max_tokens * max(itl, seconds_per_token)
    if margins and abandons(workload) and watches_the_leave(scenario):
        # The scenario's point is that the user leaves mid-stream. On a machine the
        # server shares with the client (the tier's CPU vLLM), a starved client was seen
        # reading its first token 3.4 s late, after a stream paced to 4.5 s had been
        # generated to its end: no abort to see. So an abandoning stream whose scenario
        # watches what the leave does lasts ABANDON_MARGIN longer than the scenario's; a
        # server that aborts promptly generates no more for it.
        seconds += ABANDON_MARGIN
    elif margins and abandons(workload):
        # One that holds the answer to its end (nginx-gzip) is judged on that silence
        # (`perceived_ttft_ms: {min: 1200}`): HOLD_MARGIN keeps it as long when the
        # server runs faster than the probe measured, and short of a 5 s read timeout.
        seconds += HOLD_MARGIN
    frame_margin = FRAME_MARGIN if margins else 1.0
    framed = workload.max_tokens * tokens_per_frame * frame_margin if tokens_per_frame > 1 else 0
    scaled = min(max(math.ceil(seconds / seconds_per_token), math.ceil(framed)), MAX_PACED_TOKENS)
    if scaled <= workload.max_tokens:
        return workload
    return dataclasses.replace(workload, max_tokens=scaled)


TOOL_WASTE = "server.tool_call_tokens_wasted"
PACE_BOUND_METRICS = ("server.tokens_wasted",)
"""Token counts whose `expect:` bounds are written for the scenario's pace: tokens
generated for nobody is the time the server went on decoding after the client left, in
tokens of the scenario's `itl`."""


def in_decoding_time(
    checks: list[Check], scenario: Scenario, server_ms_per_token: float | None
) -> list[Check]:
    """The checks with every PACE_BOUND_METRICS bound judged in decoding time against a
    real server: `max: 3` at the scenario's 15 ms ITL is 45 ms of decoding, which a
    server at 3 ms a token fills with 15 tokens. The same abort latency wastes more
    tokens on a faster server; what the scenario bounds is how long the server went on.

    Or in tokens, as written, when that is the looser: a hop that learns of the client's
    leave from a failed write (apache-default: the second write after the FIN fails,
    `ignore_client_close`) waits for the server's next frames, not for a time, so on a
    server slower than the scenario it costs the same two tokens in more milliseconds
    (measured: apache-default/httpx-sse w4 at 80 ms a token, where the scenario's 40 ms
    are 0.5 tokens). Which of the two a path's mechanism counts depends on the path (a
    cork's timer or an abort latency counts time, a failed write counts frames), so a
    bound is met when it is met in either; a path that never passes the close on wastes
    the rest of the stream and fails both. The measured token count is reported
    unchanged; the check says how it was judged."""
    block: Any = scenario.sections.get("upstream")
    itl_ms = float(getattr(block, "itl", 0.0) or 0.0) * 1000
    if not server_ms_per_token or not itl_ms:
        return checks
    judged = []
    for check in checks:
        numeric = isinstance(check.expected, int | float) and isinstance(check.actual, int | float)
        if check.name not in PACE_BOUND_METRICS or not numeric or check.condition == "equals":
            judged.append(check)
            continue
        bound = check.expected * itl_ms / server_ms_per_token
        if check.condition == "min":
            passed = check.actual >= min(bound, check.expected)
            step = ""
        else:
            # A real engine learns of an abort between decode steps, so the step in flight
            # when the client left completes: one token the emulator's exact abort has not.
            passed = check.actual <= max(bound, check.expected) + 1
            step = " + the step in flight"
        note = (
            f"judged in decoding time: {check.expected} tokens at the scenario's "
            f"{itl_ms:g} ms = {check.expected * itl_ms:g} ms = {bound:.1f} tokens at the "
            f"server's {server_ms_per_token:g} ms, or {check.expected} as written when "
            f"that is the looser{step}"
        )
        judged.append(dataclasses.replace(check, passed=passed, note=note))
    return judged


LEAVE_METRICS = ("server.aborted", "server.tokens_wasted")
"""What a scenario expects of a client's leave, when it watches one (`watches_the_leave`)."""


def watches_the_leave(scenario: Scenario) -> bool:
    """The scenario expects something of what the client's leave does to the server: an
    abort (`server.aborted` other than 0) or a bound on tokens wasted, for any client.
    One that expects no abort and bounds no waste holds the answer until its end
    (nginx-gzip: zlib releases nothing before the upstream ends): its point is that
    silence, which a longer stream would only lengthen past what the emulator's run
    shows (httpx's 5 s read timeout fired on the paced stream, at 6.2 s of silence)."""
    expect = scenario.sections.get("expect") or {}
    blocks = [expect, *(v for v in expect.values() if isinstance(v, dict))]
    for block in blocks:
        for name in LEAVE_METRICS:
            if name in block and not (name == "server.aborted" and block[name] == 0):
                return True
    return False


def abandons(workload: Workload) -> bool:
    """The workload's client leaves mid-stream on purpose (after N tokens or seconds)."""
    return workload.abandon_after_tokens is not None or workload.abandon_after_seconds is not None


def needs_emulator(scenario: Scenario) -> str | None:
    """Why the scenario cannot run against a real server (`--upstream`), or None: every
    `upstream:` field outside IMITATION_FIELDS that differs from its default (the block
    is the loader's `EmulatorConfig`, whose class gives the fields and the defaults)."""
    block: Any = scenario.sections.get("upstream")
    if not (dataclasses.is_dataclass(block) and not isinstance(block, type)):
        return None
    default = type(block)()
    reasons = [
        f"upstream.{f.name}: {WHY_EMULATOR.get(f.name, 'emulator behaviour')}"
        for f in dataclasses.fields(block)
        if f.name not in IMITATION_FIELDS and getattr(block, f.name) != getattr(default, f.name)
    ]
    return "; ".join(reasons) or None


STORE_NEEDED = (
    "needs a server that keeps background Responses (upstream.responses_store): this one "
    "refused `background: true`; start vLLM with VLLM_ENABLE_RESPONSES_API_STORE=1 "
    "(`make vllm` does)"
)


async def store_problem(scenario: Scenario, upstream: UpstreamClient, model: str) -> str | None:
    """A scenario that asks for the Responses store (`upstream.responses_store`) against a
    real server that was started without it: said before any client runs, since every
    background request of the scenario would get a 400 and be scored as the client's."""
    block: Any = scenario.sections.get("upstream")
    if not getattr(block, "responses_store", False):
        return None
    return None if await akeeps_background_responses(upstream, model) else STORE_NEEDED


# ----------------------------------------------------------------- one scenario


async def run_scenario(
    scenario: Scenario,
    clients: list[ClientSpec],
    *,
    seed: int | None,
    upstream_url: str | None,
    workdir: Path,
) -> ScenarioOutcome:
    seed = scenario.seed if seed is None else seed
    scenario = dataclasses.replace(scenario, seed=seed)
    outcome = ScenarioOutcome(scenario, seed)
    workload = scenario.sections.get("workload") or Workload()
    expect = scenario.sections.get("expect") or {}
    chosen = [c for c in clients if workload.clients is None or c.name in workload.clients]
    given = {c.name for c in clients}
    # agent and dialect clients run where a scenario names them (clients.SCENARIO_CLIENTS,
    # clients.DIALECT_CLIENTS), given or not
    named = [n for n in workload.clients or () if n in SCENARIO_CLIENTS or n in DIALECT_CLIENTS]
    chosen += [ClientSpec(n, list(BUILTIN_CLIENTS[n])) for n in named if n not in given]
    outcome.problems += [
        str(problem)
        for problem in client_problems(scenario, [*BUILTIN_CLIENTS, *(c.name for c in clients)])
    ]
    if outcome.problems:
        return outcome
    if upstream_url is not None:
        outcome.needs_emulator = needs_emulator(scenario)
        if outcome.needs_emulator:
            return outcome  # neither failed nor run as if it tested something
    await trio.Path(workdir).mkdir(parents=True, exist_ok=True)
    runs: list[ClientRun] = []
    ledger: list[dict[str, Any]] = []
    emulator = None
    try:
        if upstream_url is None:
            emulator = await start_emulator(emulator_config(scenario, seed), workdir)
        base_url = emulator.url if emulator is not None else str(upstream_url)
        upstream = UpstreamClient(base_url)
        model = await amodel(upstream)
        if emulator is None:
            if (problem := await store_problem(scenario, upstream, model)) is not None:
                outcome.problems.append(f"{scenario.source}: {problem}")
                return outcome
            pace = await apace(upstream, model)
            pace_args = (
                None if pace is None else pace.seconds_per_token,
                1.0 if pace is None else pace.tokens_per_frame,
            )
            workload, outcome.needs_context = within_context(
                paced(workload, scenario, *pace_args),
                paced(workload, scenario, *pace_args, margins=False),
                await acontext(upstream),
                prompt_token_bound(workload, scenario.name, model),
            )
            if outcome.needs_context:
                return outcome  # neither failed nor run as if it tested something
            outcome.paced = {
                "server_ms_per_token": None
                if pace is None
                else round(pace.seconds_per_token * 1000, 2),
                "tokens_per_frame": None if pace is None else round(pace.tokens_per_frame, 2),
                "max_tokens": workload.max_tokens,
            }
        address = Address.parse(base_url)
        one_client = partial(
            run_client, scenario=scenario, workload=workload, upstream=address, model=model,
            workdir=workdir, body_extra=real_body_extra(workload) if emulator is None else None,
        )  # fmt: skip
        if emulator is None:
            # A real server has no ledger: run the clients one at a time so its /metrics
            # counters, sampled around each of them, are that client's.
            # A failed take is taken again, up to three takes, and the least disturbed
            # counts (middlebox.run.takes: the rule make calibrate uses for real proxies).
            for spec in chosen:
                take_once = partial(
                    real_server_take, upstream, one_client, spec, outcome, clients, expect,
                    workdir,
                )  # fmt: skip
                kept, takes = await taken(take_once)
                runs.append(keep_take(kept, takes, workdir))
        else:

            async def one(spec: ClientSpec) -> None:
                runs.append(await one_client(spec))

            async with watching_loop_lag() as lag, trio.open_nursery() as clients_nursery:
                for spec in chosen:
                    clients_nursery.start_soon(one, spec)
            ledger = await settled_ledger(upstream)
            retake = partial(
                emulator_take, scenario=scenario, seed=seed, workload=workload, model=model,
                outcome=outcome, clients=clients, expect=expect, workdir=workdir,
            )  # fmt: skip
            runs, ledger = await retaken_on_the_emulator(
                runs, ledger, lag, retake, outcome, clients, expect, workdir
            )
    except (RunError, UpstreamError, UpstreamStartError) as error:
        outcome.problems.append(f"{scenario.name}: {error}")
        ledger = []
    finally:
        if emulator is not None:
            await stop_emulator(emulator)
    # kept for the timelines and report.html (middlebox.report.html_page)
    (workdir / "ledger.json").write_text(json.dumps(ledger))
    score_runs(outcome, runs, chosen, clients, ledger, expect, workdir)
    return outcome


async def real_server_take(
    upstream: UpstreamClient,
    one_client: Callable[..., Awaitable[ClientRun]],
    spec: ClientSpec,
    outcome: ScenarioOutcome,
    clients: list[ClientSpec],
    expect: Any,
    workdir: Path,
    number: int,
) -> Take:
    """One take of `spec` against a real server, sampled, watched and scored (a re-take
    in its own folder: `take-N`, so the kept take's files can be put back)."""
    folder = workdir if number == 1 else workdir / f"take-{number}"
    await trio.Path(folder).mkdir(parents=True, exist_ok=True)
    async with watching_loop_lag() as lag:
        run, samples = await sampled(upstream, partial(one_client, spec, workdir=folder))
    run.samples = [(s.at, s.running, s.generated) for s in samples]
    run.workdir = folder
    return take_of(outcome, run, score_run(outcome, run, clients, [], expect), lag)


CLOCKED_METRICS = frozenset(
    {*PACE_BOUND_METRICS, "client.bursts", "client.tokens_per_burst", DELIVERED_TOKENS_PER_BURST,
     SERVER_TOKENS_PER_BURST}
)  # fmt: skip
"""Measures read off the wall clock, besides every `*_ms` one: tokens made between a leave
and its abort, and bursts (pieces within 10 ms of each other: a reader woken late reads
several at once; x-accel-buffering-fix's node-ai-sdk read 2.8 tokens a burst at load 15,
where 1 is smooth)."""


def clocked(metric: str) -> bool:
    return metric in CLOCKED_METRICS or metric.endswith("_ms")


def clocked_failure(score: ClientScore) -> bool:
    """The run failed, and only on checks of measures read off the wall clock (`clocked`):
    against the emulator these are what a machine that ran late changes, and nothing
    else is (its text, sizes and verdicts are its seed's)."""
    failed = [check for check in score.checks if not check.passed]
    return bool(failed) and all(clocked(check.name) for check in failed)


def take_of(outcome: ScenarioOutcome, run: ClientRun, score: ClientScore, lag: LoopLag) -> Take:
    """A scored run as a take: held when every check is met and every declared fault fired."""
    proof = fault_proof([f.name for f in outcome.scenario.path], {run.spec.name: run.journal})
    unproven = proof_problems(outcome.scenario.name, proof, outcome.scenario.quiet_faults)
    failed = [f"{c.name} {c.condition} {c.expected}: got {c.actual}" for c in score.checks
              if not c.passed]  # fmt: skip
    failed += run_problems(run, score)
    stall = server_stall(e.token_times for e in upstream_exchanges(run))
    disturbance = Disturbance(stall, lag.worst, lag.gc_worst)
    # an upstream that refused every request refuses a re-take too: no disturbance is why
    refused = upstream_problem(score) is not None
    return Take(run, not (failed or unproven), disturbance, "; ".join(failed + unproven), refused)


def run_problems(run: ClientRun, score: ClientScore) -> list[str]:
    """What makes a client's run no test of it, whatever its checks say: no result to read
    (none, or one that breaks the contract), or an upstream that answered only errors."""
    problems = [run.missing_result()] if run.result is None and not run.hang else []
    refused = upstream_problem(score)
    return problems + ([refused] if refused else [])


async def emulator_take(
    spec: ClientSpec,
    number: int,
    *,
    scenario: Scenario,
    seed: int,
    workload: Workload,
    model: str,
    outcome: ScenarioOutcome,
    clients: list[ClientSpec],
    expect: Any,
    workdir: Path,
) -> Take:
    """Take `number` of one client alone, against a fresh emulator with the scenario's
    config and seed (an emulator's state, a storm's 429 budget among it, is the first
    take's to spend), in its own folder; scored with that emulator's ledger."""
    folder = workdir / f"take-{number}"
    await trio.Path(folder).mkdir(parents=True, exist_ok=True)
    emulator = await start_emulator(emulator_config(scenario, seed), folder)
    try:
        address = Address.parse(emulator.url)
        async with watching_loop_lag() as lag:
            run = await run_client(spec, scenario, workload, address, model, folder)
        run.ledger = await settled_ledger(UpstreamClient(emulator.url))
    finally:
        await stop_emulator(emulator)
    run.workdir = folder
    return take_of(outcome, run, score_run(outcome, run, clients, run.ledger, expect), lag)


async def retaken_on_the_emulator(
    runs: list[ClientRun],
    ledger: list[dict[str, Any]],
    lag: LoopLag,
    retake: Callable[[ClientSpec, int], Awaitable[Take]],
    outcome: ScenarioOutcome,
    clients: list[ClientSpec],
    expect: Any,
    workdir: Path,
) -> tuple[list[ClientRun], list[dict[str, Any]]]:
    """The runs, with each that failed only on the wall clock (`clocked_failure`) taken
    again alone, up to three takes, the least disturbed counting (middlebox.run.takes):
    the emulator keeps its schedule only while the machine does (client-vanishes beside
    three busy loops: the two tokens due while it waited 33 ms for a core were made in
    the turn that read the vanish's FIN, for nobody). The ledger comes back with a kept
    re-take's entries in place of that client's first ones, for the report's timelines."""
    kept_runs: list[ClientRun] = []
    for run in runs:
        score = score_run(outcome, run, clients, ledger, expect)
        if not clocked_failure(score):
            kept_runs.append(run)
            continue
        run.workdir = workdir  # the first take's files, kept aside should a re-take count
        first = take_of(outcome, run, score, lag)
        kept, takes = await taken(partial(retake_after, first, retake, run.spec))
        kept_run = keep_take(kept, takes, workdir)
        if kept_run.ledger is not None:
            ledger = [e for e in ledger if not ledger_tagged(e, run.tags)] + kept_run.ledger
        kept_runs.append(kept_run)
    return kept_runs, ledger


async def retake_after(
    first: Take,
    retake: Callable[[ClientSpec, int], Awaitable[Take]],
    spec: ClientSpec,
    number: int,
) -> Take:
    """`taken`'s take: the first one is already taken (with the other clients)."""
    return first if number == 1 else await retake(spec, number)


def ledger_tagged(entry: dict[str, Any], tags: list[str]) -> bool:
    return any(ledger_for([entry], tag) for tag in tags)


# what a client run leaves beside its journal (client_runs.run_client writes them)
CLIENT_FILES = ("workload.json", "result.json", "stderr.log")


def keep_take(kept: Take, takes: list[Take], workdir: Path) -> ClientRun:
    """The kept take's run, its files where a first take's are, and every take's record."""
    run: ClientRun = kept.run
    run.takes = [take.to_json(n, take is kept) for n, take in enumerate(takes, 1)]
    for number, take in enumerate(takes, 1):
        if take is not kept:  # its journal, samples and result beside its files, to read why
            folder = workdir / f"take-{number}"
            folder.mkdir(parents=True, exist_ok=True)
            name = take.run.spec.name
            take.run.journal.write_ndjson(folder / f"{name}.journal.ndjson")
            if take.run.samples:  # a real server's /metrics, sampled
                (folder / f"{name}.metrics.json").write_text(json.dumps(take.run.samples))
            if take.run.ledger is not None:  # a re-take's own emulator
                (folder / "ledger.json").write_text(json.dumps(take.run.ledger))
            # the first take's files are where the kept take's go: keep them first
            if take.run.workdir == workdir:
                _copy_client_files(workdir, folder, name)
    if run.workdir is not None and run.workdir != workdir:
        _copy_client_files(run.workdir, workdir, run.spec.name)
    return run


def _copy_client_files(source: Path, target: Path, client: str) -> None:
    for name in CLIENT_FILES:
        path = source / f"{client}.{name}"
        if path.exists():
            shutil.copyfile(path, target / path.name)


def score_run(
    outcome: ScenarioOutcome,
    run: ClientRun,
    clients: list[ClientSpec],
    ledger: list[dict[str, Any]],
    expect: Any,
) -> ClientScore:
    """One client's run scored and held to the scenario's `expect:` (nothing written)."""
    scenario = outcome.scenario
    declared = [spec.name for spec in scenario.path]
    # a cassette's replays say nothing of what they sent: the upstream leg does
    ledger, replayed = split_replays(ledger)
    # the upstream leg as the journal framed it once (no second framing pass here)
    traffic = [j.leg("upstream") for _, j in sorted(run.journal.journals.items())]
    reports = [(r.fault, r.action) for r in run.journal.fault_reports()]
    # attempts are counted where the client sent them: its leg of the journal
    journals = [j for _, j in sorted(run.journal.journals.items())]
    client_traffic = [j.leg("client") for j in journals]
    score = score_client(
        scenario.name,
        run.spec.name,
        run.tags,
        None if run.hang else run.result,
        ledger,
        traffic,
        reports,
        declared,
        client_traffic=client_traffic,
        no_result=run.result is None and not run.hang,
    )
    if replayed:  # the generations a cassette served, as the ledger counts them
        ours: list[Mapping[str, Any]] = [e for e in replayed if ledger_tagged(e, run.tags)]
        score.metrics.update(server_metrics(ours))
    score.metrics.update(run.server_metrics)
    delivered = delivered_tokens_per_burst(
        delivered_token_times(leg, partial(client_leg_time, journal))
        for leg, journal in zip(client_traffic, journals, strict=True)
    )
    if delivered is not None:
        score.metrics[DELIVERED_TOKENS_PER_BURST] = delivered
    if not ledger and score.metrics.get(TOOL_WASTE):  # none counted: nothing to lower
        # A real server's stalls merge a call into one read: only what came after the
        # client's stream stopped was generated for nobody (agent_checks explains).
        after = fragments_read_after_the_client_stopped(run.journal.journals.values())
        score.metrics[TOOL_WASTE] = min(score.metrics[TOOL_WASTE], after)
    if not ledger and run.samples:
        score.metrics.update(real_server_score(run, score.metrics))
    # Every built-in name is a client block, whether or not that client ran today.
    score.checks = evaluate_expect(
        expect, run.spec.name, score.metrics, [*BUILTIN_CLIENTS, *(c.name for c in clients)]
    )
    if not ledger and outcome.paced:
        own = score.metrics.get(SERVER_MS_PER_TOKEN)
        score.checks = in_decoding_time(
            score.checks, scenario, own or outcome.paced.get("server_ms_per_token")
        )
        score.checks = at_server_lumpiness(score.checks, score.metrics)
    score.takes = run.takes
    return score


def score_runs(
    outcome: ScenarioOutcome,
    runs: list[ClientRun],
    chosen: list[ClientSpec],
    clients: list[ClientSpec],
    ledger: list[dict[str, Any]],
    expect: Any,
    workdir: Path,
) -> None:
    """Score each client's run into `outcome`, write its journal, then the fault proof."""
    scenario = outcome.scenario
    declared = [spec.name for spec in scenario.path]
    order = {spec.name: i for i, spec in enumerate(chosen)}
    for run in sorted(runs, key=lambda r: order[r.spec.name]):
        own = ledger if run.ledger is None else run.ledger  # a kept re-take's emulator
        score = score_run(outcome, run, clients, own, expect)
        outcome.problems += [
            f"{scenario.name}/{run.spec.name}: {problem}" for problem in run_problems(run, score)
        ]
        run.journal.write_ndjson(workdir / f"{run.spec.name}.journal.ndjson")
        if run.samples:  # a real server's /metrics as sampled: what server.* came from
            (workdir / f"{run.spec.name}.metrics.json").write_text(json.dumps(run.samples))
        outcome.scores.append(score)
    if runs:
        outcome.proof = fault_proof(declared, {run.spec.name: run.journal for run in runs})
        outcome.problems += proof_problems(scenario.name, outcome.proof, scenario.quiet_faults)


def client_leg_time(journal: ConnectionJournal, direction: Direction, offset: int) -> float:
    """When the byte at `offset` crossed the client leg `direction`-wards (wall clock)."""
    return journal.time_at("client", direction.value, offset)


def leg_time(journal: ConnectionJournal, direction: Direction, offset: int) -> float:
    """When the byte at `offset` crossed the upstream leg `direction`-wards (wall clock)."""
    return journal.time_at("upstream", direction.value, offset)


def upstream_exchanges(run: ClientRun) -> list[UpstreamExchange]:
    """Every request the client's proxy sent the real server, with the journal's times."""
    found: list[UpstreamExchange] = []
    for _, journal in sorted(run.journal.journals.items()):
        closes = [
            at + journal.clock_offset
            for at, op, leg, direction, kind, _ in journal.records
            if op == "end" and leg == "upstream" and direction == Direction.UPSTREAM.value
            and kind in ("sent_fin", "sent_rst", "write_failed")
        ]  # fmt: skip
        found += exchanges_of(
            journal.leg("upstream"),
            partial(leg_time, journal),
            min(closes, default=None),
        )
    return found


def real_server_score(run: ClientRun, metrics: dict[str, Any]) -> dict[str, Any]:
    """`server.*` of a real server from its sampled /metrics and the journal, and the
    tokens per burst the client saw, which needs the tokens generated."""
    results = (run.result or {}).get("results", [])
    left = {
        run.tags[int(r["index"])]: float(r["ended_at"])
        for r in results
        if r.get("ended_at") and int(r["index"]) < len(run.tags)
    }
    exchanges = upstream_exchanges(run)
    client_legs = [journal.leg("client") for _, journal in sorted(run.journal.journals.items())]
    measured = real_server_metrics(exchanges, run.samples, left, response_answers(client_legs))
    bursts = metrics.get("client.bursts") or 0
    # only the tokens generated while the client was there can be in its bursts
    reached = max(measured["server.tokens_generated"] - measured["server.tokens_wasted"], 0)
    measured["client.tokens_per_burst"] = reached / bursts if bursts else 0.0
    measured[SERVER_MS_PER_TOKEN] = sampled_ms_per_token(
        run.samples, min(left.values(), default=None)
    )
    arrived = sum(len(arrivals(e.token_times)) for e in exchanges)
    measured[SERVER_TOKENS_PER_BURST] = (
        measured["server.tokens_generated"] / arrived if arrived else 0.0
    )
    chunks = sum(len(e.token_times) for e in exchanges)
    measured[SERVER_CHUNKS_PER_BURST] = chunks / arrived if arrived else 0.0
    return measured


SERVER_CHUNKS_PER_BURST = "server.chunks_per_burst"
"""A real server's token chunks per burst on the upstream leg: the unit of the path's delivery
to the client's socket (`client.delivered_tokens_per_burst` counts chunks, not tokens)."""


SERVER_MS_PER_TOKEN = "server.ms_per_token"
"""A real server's decoding pace during the client's own generations (`sampled_ms_per_token`)."""


def sampled_ms_per_token(
    samples: Sequence[tuple[float, float, float]], until: float | None
) -> float | None:
    """How fast the server decoded while it served this client, from its own /metrics: the
    generation-token counter's rise over the time between the first and the last sample
    taken while a request ran (before `until`, the client's leaving, when given). The pace
    probed before the scenario is one moment; on these shared cores the load swings within
    a minute (probes read 5.8 to 64.7 ms a token within one library run at load average
    15-22), and a bound on tokens generated for nobody is the time vLLM went on decoding
    *then*. Not the frames at the proxy: a hop that holds bytes back (haproxy's cork) slows
    the proxy's reads, not vLLM's decoding. None with fewer than two such samples or no
    rise between them."""
    running = [
        (at, generated)
        for at, busy, generated in samples
        if busy >= 1 and (until is None or at <= until)
    ]
    if len(running) < 2:
        return None
    (first, low), (last, high) = running[0], running[-1]
    if high <= low or last <= first:
        return None
    return round((last - first) * 1000 / (high - low), 2)


def at_server_lumpiness(checks: list[Check], metrics: dict[str, Any]) -> list[Check]:
    """A `max` bound on `client.tokens_per_burst` judged against what a real server sent.

    The bound is written for the emulator, whose frames come one token each, `itl`
    apart: `max: 2` says no hop between it and the client lumped them. A real vLLM's
    stream reaches the proxy lumpy already: several tokens per frame when its API server
    lags its engine, frames closer than BURST_GAP (10 ms) when it decodes in 3-10 ms.
    No hop can deliver a stream smoother than it was sent, so the bound is tokens per
    burst *relative to the server's* (`server.tokens_per_burst`, the same 10 ms rule on
    the upstream leg): `max: 2` allows twice the server's own lumps. The emulator's are
    1, so it is the same check there. A `min` bound (a hop that buffers) stays as
    written: the server's lumps only add to the client's.

    A client that read in bigger lumps than the path delivered to its socket (the
    journal's client leg: `client.delivered_tokens_per_burst`, in chunks, against the
    server's chunks per burst) lumped them itself: its process shares the cores with a
    real vLLM decoding on the CPU, which can hold it back for a whole answer (measured: a
    client's first read 0.85 s after the path began writing, at 1.9 ms a token). That is
    the test rig's, not a hop's, so the bound holds where the path's delivery meets it."""
    server = metrics.get(SERVER_TOKENS_PER_BURST)
    if not isinstance(server, int | float) or server <= 1:
        return checks
    judged = []
    for check in checks:
        numeric = isinstance(check.expected, int | float) and isinstance(check.actual, int | float)
        if check.name != "client.tokens_per_burst" or check.condition != "max" or not numeric:
            judged.append(check)
            continue
        bound = check.expected * server
        note = (
            f"judged against the server's own lumps: it sent {server:.2f} tokens per burst "
            f"to the proxy, so max {check.expected} = {bound:.2f} tokens per burst"
        )
        passed = check.actual <= bound
        delivered = metrics.get(DELIVERED_TOKENS_PER_BURST)
        chunks = metrics.get(SERVER_CHUNKS_PER_BURST)
        if not passed and isinstance(delivered, int | float) and isinstance(chunks, int | float):
            passed = delivered <= check.expected * max(chunks, 1.0)
            note += (
                f"; the path delivered {delivered:.2f} chunks per burst to the client's "
                f"socket against the server's {chunks:.2f}, "
                + (
                    "within the bound: the client's own process read them later in bigger "
                    "lumps (it shares the cores with the server under test), not a hop"
                    if passed
                    else "beyond the bound: a hop lumped them"
                )
            )
        judged.append(dataclasses.replace(check, passed=passed, note=note))
    return judged


def proof_problems(
    scenario: str, proof: dict[str, Any], quiet_faults: tuple[str, ...] = ()
) -> list[str]:
    """Fail loudly when the run proves nothing: a client whose traffic never reached the
    proxy (it bypassed it), a declared fault that fired for no client at all, or one that
    fired for some clients but never for one that reached the proxy (that client's
    verdict proves nothing about the fault: its requests did not match, e.g. an
    EventSource `GET` past a `match:` on the POST). Faults the scenario lists as
    `quiet_faults` must fire for no client instead."""
    problems = [
        f"{scenario}/{client}: no connection reached the proxy (0 connections): the "
        f"client bypassed it or never connected, so nothing was tested"
        for client, count in proof["connections"].items()
        if count == 0
    ]
    if any(proof["connections"].values()):
        problems += [
            f"{scenario}: declared fault {name!r} never fired for any client "
            f"({counts['bypassed']} connections went through it untouched); the scenario "
            f"did not test what it claims"
            for name, counts in proof["faults"].items()
            if counts["fired"] == 0 and name not in quiet_faults
        ]
        problems += [
            f"{scenario}/{client}: declared fault {name!r} fired for "
            f"{', '.join(counts['clients_fired'])} but never for {client}: its verdict "
            f"does not test the fault"
            for name, counts in proof["faults"].items()
            if counts["fired"] and name not in quiet_faults
            for client in counts.get("clients_bypassed", [])
            if proof["connections"].get(client)
        ]
        problems += [
            f"{scenario}: fault {name!r} is listed in quiet_faults but fired "
            f"{counts['fired']} time(s): the fix the scenario shows did not hold"
            for name, counts in proof["faults"].items()
            if counts["fired"] and name in quiet_faults
        ]
    return problems


# --------------------------------------------------------------------- a suite


async def run_suite_async(
    scenarios: list[Scenario],
    clients: list[ClientSpec],
    *,
    seed: int | None,
    upstream_url: str | None,
    workdir: Path,
    jobs: int,
) -> list[ScenarioOutcome]:
    """Run the scenarios; on SIGINT/SIGTERM stop every process started and raise
    `Interrupted` (the proxies are tasks here and stop with the run)."""
    children = Children()
    CHILDREN.set(children)  # tasks started below inherit it
    caught: list[signal.Signals] = []

    async def cancel_on_signal(scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                caught.append(signal.Signals(signum))
                scope.cancel()
                return

    outcomes: list[ScenarioOutcome] = []
    try:
        async with trio.open_nursery() as guard:
            if threading.current_thread() is threading.main_thread():
                guard.start_soon(cancel_on_signal, guard.cancel_scope)
            outcomes = await _run_all(
                scenarios, clients, seed=seed, upstream_url=upstream_url, workdir=workdir, jobs=jobs
            )
            guard.cancel_scope.cancel()
    finally:
        started = children.started
        await children.stop_all()
    if caught:
        raise Interrupted(
            f"interrupted by {caught[0].name}: every process the run started ({started}) "
            "is stopped",
            caught[0],
        )
    return outcomes


async def _run_all(
    scenarios: list[Scenario],
    clients: list[ClientSpec],
    *,
    seed: int | None,
    upstream_url: str | None,
    workdir: Path,
    jobs: int,
) -> list[ScenarioOutcome]:
    if upstream_url is not None:
        # A real server's /metrics are sampled around each client and count every
        # request it serves: one scenario at a time, or a neighbour's tokens are ours.
        jobs = 1
    limiter = trio.CapacityLimiter(max(jobs, 1))
    outcomes: dict[int, ScenarioOutcome] = {}
    progress = Progress(len(scenarios))

    async def one(index: int, scenario: Scenario) -> None:
        async with limiter:
            progress.update(started=scenario.name)
            outcomes[index] = await run_scenario(
                scenario,
                clients,
                seed=seed,
                upstream_url=upstream_url,
                workdir=run_directory(workdir, index, scenario.name),
            )
            progress.update(
                finished=scenario.name,
                failed=not outcomes[index].passed,
                results=[{**s.to_json(), "passed": s.passed} for s in outcomes[index].scores],
            )

    async with trio.open_nursery() as nursery:
        for index, scenario in enumerate(scenarios):
            nursery.start_soon(one, index, scenario)
    return [outcomes[i] for i in sorted(outcomes)]


def scenario_files(paths: Sequence[str | Path]) -> list[Path]:
    """The scenario files of `run`'s targets: files, directories, library names; none at
    all is the whole library."""
    return expand_paths(paths or [scenario_dir()])


def recorded_path(path: Path) -> str:
    """How report.json records a scenario so that `replay` finds it from any folder: a
    library scenario by its name (another install's library has it too), any other file
    by its absolute path."""
    return library_name(path) or str(path.absolute())


def run_suite(
    paths: Sequence[str],
    *,
    client_names: Sequence[str] = (),
    client_commands: Sequence[str] = (),
    seed: int | None = None,
    upstream_url: str | None = None,
    report_dir: str | Path | None = None,
    jobs: int = 2,
) -> SuiteOutcome:
    """Run scenarios (files, directories or library names; none: the whole library) and
    return every verdict; writes reports."""
    files = scenario_files(paths)
    if not files:
        raise UsageError(f"no scenario files in {', '.join(paths)}")
    scenarios = [load(path) for path in files]
    for scenario in scenarios:
        for warning in scenario.warnings:
            log.warning("%s", warning)
    if upstream_url is not None and (elsewhere := other_session_warning(upstream_url)):
        log.warning("%s", elsewhere)
    names = list(client_names) or ([] if client_commands else default_clients())
    clients = resolve_clients(names, client_commands)
    with tempfile.TemporaryDirectory(prefix="middlebox-run-") as scratch:
        workdir = Path(report_dir) / "runs" if report_dir else Path(scratch)
        outcomes = trio.run(
            lambda: run_suite_async(
                scenarios, clients, seed=seed, upstream_url=upstream_url, workdir=workdir, jobs=jobs
            )
        )
    argv = {
        "paths": [recorded_path(f) for f in files],
        "clients": list(client_names),
        "client_commands": list(client_commands),
        "upstream": upstream_url,
        "jobs": jobs,
    }
    suite = SuiteOutcome(
        outcomes, seed, [c.name for c in clients], Path(report_dir) if report_dir else None, argv
    )
    if report_dir:
        write_reports(suite.document(), Path(report_dir))
    return suite
