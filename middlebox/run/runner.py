"""`middlebox run`: start the upstream, a proxy per client and the clients; then score.

For each scenario: the embedded emulator is started in its own process with the
scenario's `upstream:` block (unless `--upstream` points at a real server); each
client under test gets its own proxy (so cross-connection fault state such as "the
first three requests get a 429" applies to each client alike), its workload file and
a bounded time; then the upstream's ledger, the proxy journals and the client results
are scored. Everything started here is stopped here, by the handle it was started
with. Scenarios run `jobs` at a time in one trio loop.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio
import yaml

from middlebox.clients import BUILTIN_CLIENTS, available_clients
from middlebox.compose import expand_paths, load
from middlebox.core.stream import Direction
from middlebox.observe.journal import JournalStore, fault_proof
from middlebox.run.score import ClientScore, evaluate_expect, expect_problems, score_client
from middlebox.scenario.model import Scenario
from middlebox.scenario.workload import Workload, request_tag, workload_file
from middlebox.shell.server import Address, ProxyServer, listen

log = logging.getLogger("middlebox.run.runner")

EMULATOR_START_TIMEOUT = 30.0
LEDGER_SETTLE_TIMEOUT = 15.0


class RunError(Exception):
    """A run could not start (bad scenario, upstream down); the message says why."""


class Interrupted(RunError):
    """SIGINT or SIGTERM stopped the run; every process it started has been stopped."""

    def __init__(self, message: str, signum: int = signal.SIGINT) -> None:
        super().__init__(message)
        self.signum = signum


CHILD_STOP_GRACE = 5.0


class Children:
    """Every process a run starts, so an interrupted run leaves none behind.

    Each child starts in its own session, so it is the leader of its own process group
    and a signal to the group reaches whatever it started in turn (a shell wrapper's
    client, a browser's helpers). Only groups whose leader we have not yet reaped are
    signalled, so a recycled pid is never hit."""

    def __init__(self) -> None:
        self.processes: set[trio.Process] = set()

    async def start(self, argv: Sequence[str], **options: Any) -> trio.Process:
        process = await trio.lowlevel.open_process(list(argv), start_new_session=True, **options)
        self.processes.add(process)
        return process

    def signal_all(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signum)
                except (ProcessLookupError, PermissionError):
                    pass

    async def stop_all(self, grace: float = CHILD_STOP_GRACE) -> None:
        """SIGTERM every live group, wait up to `grace`, then SIGKILL; shielded, so it
        completes even while the run is being cancelled."""
        with trio.CancelScope(shield=True):
            self.signal_all(signal.SIGTERM)
            with trio.move_on_after(grace):
                for process in list(self.processes):
                    await process.wait()
            self.signal_all(signal.SIGKILL)
            for process in list(self.processes):
                await process.wait()
            self.processes.clear()


_DEFAULT_CHILDREN = Children()
CHILDREN: contextvars.ContextVar[Children] = contextvars.ContextVar(
    "middlebox_children", default=_DEFAULT_CHILDREN
)


@dataclass
class ClientSpec:
    name: str
    argv: list[str]


@dataclass
class ScenarioOutcome:
    scenario: Scenario
    seed: int
    scores: list[ClientScore] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    proof: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems and all(score.passed for score in self.scores)


@dataclass
class SuiteOutcome:
    outcomes: list[ScenarioOutcome]
    seed: int | None
    clients: list[str]
    report_dir: Path | None = None

    @property
    def passed(self) -> bool:
        return all(outcome.passed for outcome in self.outcomes)


def default_clients() -> list[str]:
    """Every built-in client but the browsers: starting Chromium per scenario is slow and
    heavy, so a browser is scored when asked for (`--client browser`)."""
    return [name for name in available_clients() if not name.startswith("browser")]


def resolve_clients(names: Sequence[str], commands: Sequence[str]) -> list[ClientSpec]:
    """Built-in client names plus `--client-cmd` commands (`NAME=COMMAND` or `COMMAND`)."""
    specs = []
    for name in names:
        if name not in BUILTIN_CLIENTS:
            raise RunError(
                f"unknown client {name!r}; built-in clients: {', '.join(BUILTIN_CLIENTS)}"
            )
        specs.append(ClientSpec(name, list(BUILTIN_CLIENTS[name])))
    for number, command in enumerate(commands, start=1):
        name, sep, rest = command.partition("=")
        if sep and name.isidentifier():
            specs.append(ClientSpec(name, shlex.split(rest)))
        else:
            specs.append(
                ClientSpec(f"custom{number if len(commands) > 1 else ''}", shlex.split(command))
            )
    return specs


# ---------------------------------------------------------------- the upstream


class Emulator:
    """The embedded vllm_emulator in its own process, on 127.0.0.1 and a free port."""

    def __init__(self, config: dict[str, Any], log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.process: trio.Process | None = None
        self.url = ""

    async def start(self, nursery: trio.Nursery) -> None:
        config_file = self.log_path.with_suffix(".yaml")
        config_file.write_text(yaml.safe_dump(self.config, sort_keys=True))
        self.process = await CHILDREN.get().start(
            [
                sys.executable,
                "-m",
                "vllm_emulator",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--config",
                str(config_file),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        assert self.process.stdout is not None
        first = b""
        with trio.move_on_after(EMULATOR_START_TIMEOUT):
            while b"\n" not in first:
                data = await self.process.stdout.receive_some(4096)
                if not data:
                    break
                first += data
        line, _, rest = first.partition(b"\n")
        text = line.decode(errors="replace")
        if "listening on http://" not in text:
            self.stop()
            raise RunError(f"the emulator did not start: {first.decode(errors='replace')!r}")
        self.url = text.split("listening on ", 1)[1].strip()
        nursery.start_soon(self._drain, rest)

    async def _drain(self, already: bytes) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.log_path.open("ab") as log:
            log.write(already)
            while True:
                try:
                    data = await self.process.stdout.receive_some(65536)
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    return
                if not data:
                    return
                log.write(data)

    def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()

    async def wait_stopped(self) -> None:
        if self.process is None:
            return
        with trio.move_on_after(5):
            await self.process.wait()
        if self.process.returncode is None:
            self.process.kill()
            await self.process.wait()


def http_json(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"null")


async def fetch_json(url: str, method: str = "GET") -> Any:
    return await trio.to_thread.run_sync(http_json, url, method)


async def settled_ledger(base_url: str) -> list[dict[str, Any]]:
    """The ledger once every generation has finished or been aborted (bounded wait)."""
    ledger: list[dict[str, Any]] = []
    with trio.move_on_after(LEDGER_SETTLE_TIMEOUT):
        while True:
            ledger = (await fetch_json(f"{base_url}/emulator/requests"))["requests"]
            if all(entry.get("finished_at") or entry.get("aborted_at") for entry in ledger):
                break
            await trio.sleep(0.1)
    return ledger


GENERATION_TOKENS = "vllm:generation_tokens_total"
RUNNING = "vllm:num_requests_running"


def prometheus_totals(text: str) -> dict[str, float]:
    """Each metric's value summed over its label sets (Prometheus text format)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_and_labels, _, value = line.rpartition(" ")
        name = name_and_labels.split("{", 1)[0]
        try:
            totals[name] = totals.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return totals


def http_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode("utf-8", "replace"))


async def upstream_metrics(base_url: str) -> dict[str, float] | None:
    """vLLM's /metrics, or None when the upstream has none (a gateway, say)."""
    try:
        return prometheus_totals(await trio.to_thread.run_sync(http_text, f"{base_url}/metrics"))
    except (OSError, ValueError):
        return None


async def metered_run(base_url: str, run: Any) -> tuple[Any, dict[str, Any]]:
    """Run one client against a real vLLM and read its /metrics around the run: the
    tokens it generated, and those generated after the client had finished (for
    nobody), once vLLM reports no running request (bounded wait)."""
    before = await upstream_metrics(base_url)
    outcome = await run()
    ended = await upstream_metrics(base_url)
    after = ended
    with trio.move_on_after(LEDGER_SETTLE_TIMEOUT):
        while after is not None and after.get(RUNNING, 0.0) > 0:
            await trio.sleep(0.1)
            after = await upstream_metrics(base_url)
    if before is None or ended is None or after is None or GENERATION_TOKENS not in before:
        return outcome, {}
    return outcome, {
        "server.tokens_generated": int(after[GENERATION_TOKENS] - before[GENERATION_TOKENS]),
        "server.tokens_wasted": int(max(after[GENERATION_TOKENS] - ended[GENERATION_TOKENS], 0)),
    }


async def model_of(base_url: str) -> str:
    try:
        models = await fetch_json(f"{base_url}/v1/models")
        return str(models["data"][0]["id"])
    except (OSError, KeyError, IndexError, ValueError) as error:
        raise RunError(f"cannot list models at {base_url}/v1/models: {error}") from None


# ------------------------------------------------------------------- one client


@dataclass
class ClientRun:
    spec: ClientSpec
    tags: list[str]
    journal: JournalStore
    result: dict[str, Any] | None = None
    hang: bool = False
    stderr_tail: str = ""
    server_metrics: dict[str, Any] = field(default_factory=dict)


async def run_client(
    spec: ClientSpec,
    scenario: Scenario,
    workload: Workload,
    upstream: Address,
    model: str,
    workdir: Path,
) -> ClientRun:
    """One proxy, one client process, bounded by the workload timeout."""
    journal = JournalStore(capture=True)
    server = ProxyServer(
        upstream,
        scenario,
        observer_factory=lambda cid, s: journal.observer(cid, time.time(), s.name),
        report_sink_factory=journal.fault_sink,
    )
    document = workload_file(workload, scenario.name, spec.name, model)
    tags = [request_tag(scenario.name, spec.name, i) for i in range(workload.requests)]
    run = ClientRun(spec, tags, journal)
    workload_path = workdir / f"{spec.name}.workload.json"
    result_path = workdir / f"{spec.name}.result.json"
    stderr_path = workdir / f"{spec.name}.stderr.log"
    workload_path.write_text(json.dumps(document, indent=1))
    listener = listen(Address("127.0.0.1", 0))
    async with trio.open_nursery() as nursery:
        port = await nursery.start(server.serve, listener)
        env = {
            **os.environ,
            "OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1",
            "OPENAI_API_KEY": "sk-middlebox-test",
            "MIDDLEBOX_WORKLOAD": str(workload_path),
            "MIDDLEBOX_RESULT": str(result_path),
        }
        with stderr_path.open("wb") as stderr:
            process = await CHILDREN.get().start(spec.argv, env=env, stdout=stderr, stderr=stderr)
            with trio.move_on_after(workload.timeout) as bound:
                await process.wait()
            if bound.cancelled_caught:
                run.hang = True
                process.kill()  # the process we started, by its handle
                await process.wait()
        # let the proxy carry the last closes to the upstream before we stop it
        with trio.move_on_after(2):
            while server.active:
                await trio.sleep(0.02)
        nursery.cancel_scope.cancel()
    listener.close()
    if result_path.exists():
        try:
            run.result = json.loads(result_path.read_text())
        except ValueError:
            run.result = None
    run.stderr_tail = stderr_path.read_text(errors="replace")[-2000:]
    return run


# ----------------------------------------------------------------- one scenario


def emulator_config(scenario: Scenario, seed: int) -> dict[str, Any]:
    upstream: Any = scenario.sections.get("upstream")
    if dataclasses.is_dataclass(upstream) and not isinstance(upstream, type):
        config = dataclasses.asdict(upstream)
    else:
        config = dict(upstream or {})
    config.setdefault("seed", seed)
    return config


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
    outcome.problems += [
        f"{scenario.source}: {p}"
        for p in expect_problems(expect, BUILTIN_CLIENTS.keys() | {c.name for c in clients})
    ]
    if outcome.problems:
        return outcome
    workdir.mkdir(parents=True, exist_ok=True)
    emulator = (
        None
        if upstream_url
        else Emulator(emulator_config(scenario, seed), workdir / "emulator.log")
    )
    runs: list[ClientRun] = []
    async with trio.open_nursery() as nursery:
        try:
            if emulator is not None:
                await emulator.start(nursery)
            base_url = upstream_url or (emulator.url if emulator else "")
            model = await model_of(base_url)
            upstream = Address.parse(base_url)

            async def one(spec: ClientSpec) -> None:
                runs.append(await run_client(spec, scenario, workload, upstream, model, workdir))

            if emulator is None:
                # A real server has no ledger: run the clients one at a time so its
                # /metrics counters can be read around each of them.
                for spec in chosen:
                    run, measured = await metered_run(
                        base_url,
                        partial(run_client, spec, scenario, workload, upstream, model, workdir),
                    )
                    run.server_metrics = measured
                    runs.append(run)
            else:
                async with trio.open_nursery() as clients_nursery:
                    for spec in chosen:
                        clients_nursery.start_soon(one, spec)
            ledger = await settled_ledger(base_url) if emulator is not None else []
        except RunError as error:
            outcome.problems.append(f"{scenario.name}: {error}")
            ledger = []
        finally:
            if emulator is not None:
                emulator.stop()
                await emulator.wait_stopped()
            nursery.cancel_scope.cancel()
    declared = [spec.name for spec in scenario.path]
    order = {spec.name: i for i, spec in enumerate(chosen)}
    # kept for the timelines and report.html (middlebox.report.html_page)
    (workdir / "ledger.json").write_text(json.dumps(ledger))
    for run in sorted(runs, key=lambda r: order[r.spec.name]):
        traffic = [
            (
                j.bytes_from("upstream", Direction.UPSTREAM),
                j.bytes_from("upstream", Direction.DOWNSTREAM),
            )
            for _, j in sorted(run.journal.journals.items())
        ]
        reports = [(r.fault, r.action) for r in run.journal.fault_reports()]
        score = score_client(
            scenario.name,
            run.spec.name,
            run.tags,
            None if run.hang else run.result,
            ledger,
            traffic,
            reports,
            declared,
        )
        score.metrics.update(run.server_metrics)
        # Every built-in name is a client block, whether or not that client ran today.
        score.checks = evaluate_expect(
            expect, run.spec.name, score.metrics, [*BUILTIN_CLIENTS, *(c.name for c in clients)]
        )
        if run.result is None and not run.hang:
            outcome.problems.append(
                f"{scenario.name}/{run.spec.name}: the client wrote no "
                f"result; its stderr ends with: {run.stderr_tail[-400:]}"
            )
        run.journal.write_ndjson(workdir / f"{run.spec.name}.journal.ndjson")
        outcome.scores.append(score)
    if runs:
        outcome.proof = fault_proof(declared, {run.spec.name: run.journal for run in runs})
        outcome.problems += proof_problems(scenario.name, outcome.proof, scenario.quiet_faults)
    return outcome


def proof_problems(
    scenario: str, proof: dict[str, Any], quiet_faults: tuple[str, ...] = ()
) -> list[str]:
    """Fail loudly when the run proves nothing: a client whose traffic never reached the
    proxy (it bypassed it), or a declared fault that fired for no client at all. A fault
    that fired for some clients only stays a per-client warning in the scorecard. Faults
    the scenario lists as `quiet_faults` must fire for no client instead."""
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
        started = len(children.processes)
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
                workdir=workdir / f"{index:02d}-{safe_name(scenario.name)}",
            )
            progress.update(finished=scenario.name, failed=not outcomes[index].passed)

    async with trio.open_nursery() as nursery:
        for index, scenario in enumerate(scenarios):
            nursery.start_soon(one, index, scenario)
    return [outcomes[i] for i in sorted(outcomes)]


class Progress:
    """One self-rewriting line on stderr while a suite runs, only when stderr is a TTY
    (CI logs and pipes stay clean): a bar, done/total, failures, what is running."""

    def __init__(self, total: int, stream: Any = None) -> None:
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.failed = 0
        self.running: list[str] = []

    def update(self, *, started: str = "", finished: str = "", failed: bool = False) -> str:
        if started:
            self.running.append(started)
        if finished:
            self.done += 1
            self.failed += failed
            if finished in self.running:
                self.running.remove(finished)
        filled = round(20 * self.done / max(self.total, 1))
        line = (
            f"[{'#' * filled}{'.' * (20 - filled)}] {self.done}/{self.total} scenarios"
            f"{f', {self.failed} failed' if self.failed else ''}"
            f"{'; running ' + ', '.join(self.running) if self.running else ''}"
        )[:120]
        if self.enabled:
            end = "\n" if self.done == self.total and not self.running else ""
            self.stream.write("\r\033[K" + line + end)
            self.stream.flush()
        return line


def safe_name(name: str) -> str:
    """A file name from a scenario name: no separators, no traversal (`../` stays out)."""
    cleaned = "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name).strip("-.")
    return cleaned[:80] or "scenario"


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
    """Run scenarios (files or directories) and return every verdict; writes reports."""
    files = expand_paths(paths)
    if not files:
        raise RunError(f"no scenario files in {', '.join(paths)}")
    scenarios = [load(path) for path in files]
    for scenario in scenarios:
        for warning in scenario.warnings:
            log.warning("%s", warning)
    names = list(client_names) or ([] if client_commands else default_clients())
    clients = resolve_clients(names, client_commands)
    with tempfile.TemporaryDirectory(prefix="middlebox-run-") as scratch:
        workdir = Path(report_dir) / "runs" if report_dir else Path(scratch)
        outcomes = trio.run(
            lambda: run_suite_async(
                scenarios, clients, seed=seed, upstream_url=upstream_url, workdir=workdir, jobs=jobs
            )
        )
    suite = SuiteOutcome(
        outcomes, seed, [c.name for c in clients], Path(report_dir) if report_dir else None
    )
    if report_dir:
        from middlebox.report.scorecard import write_reports

        write_reports(
            suite,
            Path(report_dir),
            argv={
                "paths": [str(f) for f in files],
                "clients": list(client_names),
                "client_commands": list(client_commands),
                "upstream": upstream_url,
                "jobs": jobs,
            },
        )
    return suite
