"""The `middlebox` command line (click). Thin: each command parses and calls one function."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import click

from middlebox import __version__

if TYPE_CHECKING:
    from middlebox.observe.journal import JournalStore
    from middlebox.scenario.model import Scenario
    from middlebox.shell.server import Address, ProxyServer

EPILOG_PROXY = """\b
Examples:
  middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000
  middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000 \\
      --scenario scenarios/nginx-default-buffering.yaml
"""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="middlebox")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """middlebox: inject the faults real networks inflict on LLM token streams, and score
    how the client and the server cope.

    \b
    Examples:
      middlebox run scenarios/ --report out/      # the main job: score every scenario
      middlebox validate scenarios/
      middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000
    """
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


# ------------------------------------------------ observability (see docs/observability.md)


def _control_options(command: Callable[..., None]) -> Callable[..., None]:
    """`proxy --control ADDR ...`: the proxy with its control API (middlebox.shell.control)."""
    import functools

    @functools.wraps(command)
    def proxy_or_controlled(
        *args: object,
        control: str | None,
        control_token: str | None,
        allow_scenario_header: bool,
        scenario_dir: str | None,
        **options: object,
    ) -> None:
        if control is None:
            if allow_scenario_header or control_token:
                raise click.UsageError("--allow-scenario-header and --control-token need --control")
            command(*args, **options)
            return
        _run_controlled(control, control_token, allow_scenario_header, scenario_dir, options)

    for option in reversed(
        [
            click.option(
                "--control",
                metavar="HOST:PORT",
                help="Serve the control API here (GET /metrics, GET|PUT|DELETE /scenario, "
                "GET /journals...). Loopback unless a token is given.",
            ),
            click.option(
                "--control-token",
                envvar="MIDDLEBOX_CONTROL_TOKEN",
                help="Bearer token the control API requires (env MIDDLEBOX_CONTROL_TOKEN); "
                "mandatory on a non-loopback address.",
            ),
            click.option(
                "--allow-scenario-header",
                is_flag=True,
                help="Let a connection pick NAME.yaml from --scenario-dir with the request "
                "header X-Middlebox-Scenario: NAME (off by default).",
            ),
            click.option(
                "--scenario-dir",
                type=click.Path(exists=True, file_okay=False),
                help="Scenarios X-Middlebox-Scenario may name.",
            ),
        ]
    ):
        proxy_or_controlled = option(proxy_or_controlled)
    return proxy_or_controlled


def _run_controlled(
    control: str,
    token: str | None,
    allow_header: bool,
    scenario_dir: str | None,
    options: dict[str, object],
) -> None:
    from pathlib import Path

    import trio

    from middlebox.compose import load
    from middlebox.scenario.convert import ScenarioError
    from middlebox.scenario.model import Scenario
    from middlebox.shell.control import ControlledProxy, check_control_access, run_controlled_proxy
    from middlebox.shell.server import Address

    if int(str(options.get("workers") or 1)) > 1:
        raise click.UsageError("--control serves one proxy process; drop --workers")
    if allow_header and not scenario_dir:
        raise click.UsageError("--allow-scenario-header needs --scenario-dir")
    scenario_file = options.get("scenario_file")
    try:
        scenario = load(str(scenario_file)) if scenario_file else Scenario(name="pass-through")
        listen_address = Address.parse(str(options["listen_at"]))
        upstream_address = Address.parse(str(options["upstream"]))
        control_address = Address.parse(control)
        check_control_access(control_address, token)
    except (ScenarioError, ValueError) as error:
        raise click.ClickException(str(error)) from None
    max_connections = options.get("max_connections")
    proxy = ControlledProxy(
        upstream_address,
        scenario,
        max_connections=int(str(max_connections)) if max_connections else None,
        scenario_dir=Path(scenario_dir) if scenario_dir else None,
        allow_scenario_header=allow_header,
    )

    def ready(port: int, control_port: int) -> None:
        click.echo(
            f"listening on http://{listen_address.host}:{port} -> {upstream_address} "
            f"(scenario {scenario.name!r}, {len(scenario.path)} faults); control API on "
            f"http://{control_address.host}:{control_port}"
        )
        sys.stdout.flush()

    journal_file = options.get("journal_file")
    try:
        trio.run(
            lambda: run_controlled_proxy(
                proxy,
                listen_address,
                control_address,
                token=token,
                ready=ready,
                grace=float(str(options.get("grace", 10.0))),
                backlog=int(str(options.get("backlog", 1024))),
            )
        )
    except KeyboardInterrupt:
        pass
    finally:
        if journal_file:
            proxy.store.write_ndjson(
                Path(str(journal_file)), redact_secrets=not options.get("journal_secrets")
            )
    click.echo(f"stopped: {proxy.connections_accepted} connections")


@main.command(epilog=EPILOG_PROXY)
@_control_options
@click.option(
    "--listen",
    "listen_at",
    default="127.0.0.1:9000",
    show_default=True,
    help="HOST:PORT to accept clients on (port 0 picks a free port).",
)
@click.option(
    "--upstream", required=True, help="URL of the LLM server, e.g. http://127.0.0.1:8000."
)
@click.option(
    "--scenario",
    "scenario_file",
    type=click.Path(exists=True, dir_okay=False),
    help="YAML scenario whose `path:` faults every connection goes through.",
)
@click.option(
    "--grace",
    type=click.FloatRange(0),
    default=10.0,
    show_default=True,
    help="On SIGTERM/SIGINT: seconds live streams get to finish before they are reset "
    "(a second signal resets them at once).",
)
@click.option(
    "--max-connections",
    type=click.IntRange(1),
    help="Close connections beyond this many at once (counted); overrides the "
    "scenario's proxy.max_connections.",
)
@click.option(
    "--backlog",
    type=click.IntRange(1),
    default=1024,
    show_default=True,
    help="listen(2) backlog: handshakes queued before accept (capped by somaxconn).",
)
@click.option(
    "--journal",
    "journal_file",
    type=click.Path(dir_okay=False),
    help="Write the connection journal (NDJSON) here on shutdown; secrets redacted.",
)
@click.option(
    "--journal-secrets",
    is_flag=True,
    help="Keep Authorization/API-key/cookie values in the journal (redacted by default).",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Proxy processes sharing the port (SO_REUSEPORT); one process uses one core. "
    "With --journal each worker writes FILE.wN.",
)
def proxy(
    listen_at: str,
    upstream: str,
    scenario_file: str | None,
    grace: float,
    max_connections: int | None,
    backlog: int,
    journal_file: str | None,
    journal_secrets: bool,
    workers: int,
) -> None:
    """Run the proxy: relay every connection byte-exact through the scenario's faults.

    SIGTERM (or Ctrl-C) stops accepting, lets live streams finish for --grace seconds,
    resets the rest, writes the journal if asked, and exits 0.
    """
    import time
    from pathlib import Path

    import trio

    from middlebox.compose import load
    from middlebox.observe.journal import JournalStore
    from middlebox.scenario.convert import ScenarioError
    from middlebox.scenario.model import Scenario
    from middlebox.shell.server import Address, ProxyServer, run_proxy

    try:
        scenario = load(scenario_file) if scenario_file else Scenario(name="pass-through")
        listen_address, upstream_address = Address.parse(listen_at), Address.parse(upstream)
    except (ScenarioError, ValueError) as error:
        raise click.ClickException(str(error)) from None

    def ready(port: int) -> None:
        click.echo(
            f"listening on http://{listen_address.host}:{port} -> {upstream_address} "
            f"(scenario {scenario.name!r}, {len(scenario.path)} faults)"
        )
        sys.stdout.flush()

    journal = JournalStore(capture=True) if journal_file else None
    server = ProxyServer(
        upstream_address,
        scenario,
        max_connections=max_connections,
        observer_factory=(
            (lambda cid, _s: journal.observer(cid, time.time(), scenario.name))
            if journal is not None
            else None
        ),
        report_sink_factory=journal.fault_sink if journal is not None else None,
    )
    if workers > 1:
        _run_workers(
            listen_address,
            upstream_address,
            scenario,
            workers,
            server,
            ready,
            grace,
            backlog,
            journal,
            journal_file,
            journal_secrets,
        )
        return
    try:
        trio.run(
            lambda: run_proxy(
                listen_address,
                upstream_address,
                scenario,
                ready=ready,
                server=server,
                grace=grace,
                backlog=backlog,
            )
        )
    except KeyboardInterrupt:  # a signal before the handlers were installed
        pass
    finally:
        if journal is not None and journal_file is not None:
            journal.write_ndjson(Path(journal_file), redact_secrets=not journal_secrets)
    click.echo(
        f"stopped: {server.connections_accepted} connections, "
        f"{server.connections_refused} refused, {server.reset_at_shutdown} reset at shutdown"
    )


def _run_workers(
    listen_address: Address,
    upstream_address: Address,
    scenario: Scenario,
    workers: int,
    server: ProxyServer,
    ready: Callable[[int], None],
    grace: float,
    backlog: int,
    journal: JournalStore | None,
    journal_file: str | None,
    journal_secrets: bool,
) -> None:
    """`proxy --workers N`: the same server settings in N supervised processes."""
    from pathlib import Path

    from middlebox.shell.workers import run_workers

    def workers_ready(port: int, pids: list[int]) -> None:
        ready(port)
        click.echo(f"workers: {' '.join(map(str, pids))}")
        sys.stdout.flush()

    def finish(index: int, _server: ProxyServer) -> None:
        if journal is not None and journal_file is not None:
            path = Path(f"{journal_file}.w{index}")
            journal.write_ndjson(path, redact_secrets=not journal_secrets)

    result = run_workers(
        listen_address,
        upstream_address,
        scenario,
        workers,
        ready=workers_ready,
        grace=grace,
        backlog=backlog,
        finish=finish,
        max_connections=server.max_connections,
        observer_factory=server.observer_factory,
        report_sink_factory=server.report_sink_factory,
    )
    click.echo(f"stopped: {result.summary()}")


@main.command()
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
def validate(paths: tuple[str, ...]) -> None:
    """Check scenario files (or directories of them); print every problem with its line.

    \b
    Example:
      middlebox validate scenarios/ my-incident.yaml
    """
    from middlebox.compose import validate_paths

    good, problems = validate_paths(paths)
    for scenario in good:
        click.echo(f"ok: {scenario.source} ({scenario.name}, {len(scenario.path)} faults)")
        for warning in scenario.warnings:
            click.echo(f"warning: {warning}", err=True)
    for problem in problems:
        click.echo(f"error: {problem}", err=True)
    if problems:
        sys.exit(1)


@main.command()
def schema() -> None:
    """Print the JSON Schema of the scenario format, generated from the fault registry.

    \b
    Example:
      middlebox schema > scenario.schema.json
    """
    from middlebox.compose import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@main.command()
@click.argument("targets", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--upstream", help="A real vLLM or gateway URL instead of the embedded emulator.")
@click.option(
    "--client",
    "clients",
    multiple=True,
    help="Built-in client to score (repeatable): raw, openai, httpx-sse, resilient, "
    "browser. Default: all but browser (Chromium is opt-in).",
)
@click.option(
    "--client-cmd",
    "client_commands",
    multiple=True,
    help="Your own client under the same contract (repeatable): 'COMMAND' or 'NAME=COMMAND'.",
)
@click.option("--seed", type=int, help="Override every scenario's seed.")
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False),
    help="Directory for report.json, junit.xml and the connection journals.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 16),
    default=2,
    show_default=True,
    help="Scenarios run at once.",
)
def run(
    targets: tuple[str, ...],
    upstream: str | None,
    clients: tuple[str, ...],
    client_commands: tuple[str, ...],
    seed: int | None,
    report_dir: str | None,
    jobs: int,
) -> None:
    """Run scenarios against the emulator (or --upstream) and score clients and server.

    Exits 1 when an `expect:` check fails or a scenario cannot run.

    \b
    Examples:
      middlebox run scenarios/
      middlebox run scenarios/nginx-default-buffering.yaml --client resilient
      middlebox run scenarios/ --client-cmd 'mine=python my_client.py' --report out/
    """
    from middlebox.report.scorecard import scorecard
    from middlebox.run.outcome import Interrupted, RunError
    from middlebox.run.suite import run_suite
    from middlebox.scenario.convert import ScenarioError

    try:
        suite = run_suite(
            targets,
            client_names=clients,
            client_commands=client_commands,
            seed=seed,
            upstream_url=upstream,
            report_dir=report_dir,
            jobs=jobs,
        )
    except Interrupted as error:
        click.echo(f"middlebox run: {error}", err=True)
        sys.exit(128 + error.signum)  # the shell's convention: 130 for SIGINT, 143 for SIGTERM
    except (RunError, ScenarioError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(scorecard(suite.document(), colour=sys.stdout.isatty()))
    if report_dir:
        click.echo(
            f"reports: {report_dir}/report.json, {report_dir}/junit.xml, "
            f"journals under {report_dir}/runs/"
        )
    if not suite.passed:
        sys.exit(1)


@main.command()
@click.argument("report_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False),
    help="Where to write the rerun's reports.",
)
def replay(report_file: str, report_dir: str | None) -> None:
    """Rerun a report.json with the same seeds and clients; fail if any verdict differs.

    \b
    Example:
      middlebox replay reports/latest/report.json
    """
    from pathlib import Path

    from middlebox.report.scorecard import scorecard
    from middlebox.run.replay import replay_report

    result = replay_report(Path(report_file), Path(report_dir) if report_dir else None)
    same, differences, suite = result.same, result.differences, result.suite
    click.echo(scorecard(suite.document(), colour=sys.stdout.isatty()))
    if same:
        click.echo("replay: every verdict identical")
        return
    for line in differences:
        click.echo(f"replay: differs: {line}", err=True)
    sys.exit(1)


@main.command()
@click.argument("journal", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="run.pcapng or .pcap"
)
@click.option("--listen-port", default=9000, show_default=True, help="Proxy port in the capture.")
@click.option("--upstream-port", default=8000, show_default=True, help="Upstream port shown.")
def pcap(journal: str, output: str, listen_port: int, upstream_port: int) -> None:
    """Turn a connection journal (NDJSON) into TCP packets for Wireshark or tshark.

    Both legs of each connection become TCP streams on 127.0.0.1 with sequence numbers
    from the journal's offsets, FINs and RSTs where the journal saw them.

    \b
    Example:
      middlebox pcap reports/latest/runs/00-x/raw.journal.ndjson -o run.pcapng
      tshark -r run.pcapng -Y 'tcp.flags.reset == 1'
    """
    from middlebox.observe.pcap import write_pcap

    count = write_pcap(journal, output, listen_port=listen_port, upstream_port=upstream_port)
    click.echo(f"wrote {count} packets to {output}")


@main.group()
def drill() -> None:
    """Training drills: diagnose an incident, then prove the fix.

    \b
    Examples:
      middlebox drill list
      middlebox drill start silent-truncation
      middlebox drill hint silent-truncation 1
      middlebox drill check silent-truncation --client-cmd 'python my_client.py'
    """


@drill.command("list")
def drill_list() -> None:
    """The drills, and where each one's fix goes."""
    from middlebox.run.drills import listing

    click.echo(listing())


@drill.command("hint")
@click.argument("name")
@click.argument("number", type=int)
def drill_hint(name: str, number: int) -> None:
    """Hint NUMBER (from 1) of drill NAME; the last one reveals the fault."""
    from middlebox.run.drills import DrillError, hint

    try:
        click.echo(hint(name, number))
    except DrillError as error:
        raise click.ClickException(str(error)) from None


@drill.command("start")
@click.argument("name")
def drill_start(name: str) -> None:
    """Print the symptoms and run the incident (emulator + proxy) until Ctrl-C."""
    import time

    from middlebox.run.drills import DrillError, briefing, start

    try:
        drill_, proxy = start(name)
    except DrillError as error:
        raise click.ClickException(str(error)) from None
    click.echo(briefing(drill_))
    click.echo(
        f"\nThe incident is live: OPENAI_BASE_URL={proxy.base_url} (model {proxy.model}). "
        f"Ctrl-C to stop."
    )
    sys.stdout.flush()
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        facts = proxy.score()
        proxy.close()
    click.echo(f"\nstopped after {facts['connections']} connections")


@drill.command("check")
@click.argument("name")
@click.option(
    "--client-cmd",
    "client_commands",
    multiple=True,
    required=True,
    help="Your client under the middlebox contract (see docs/clients.md).",
)
@click.option(
    "--scenario",
    "fixed",
    type=click.Path(exists=True, dir_okay=False),
    help="Your fixed copy of the drill's scenario (for fixes on the server/proxy side).",
)
@click.option("--report", "report_dir", type=click.Path(file_okay=False), help="Report dir.")
def drill_check(
    name: str, client_commands: tuple[str, ...], fixed: str | None, report_dir: str | None
) -> None:
    """Grade a fix: run the drill with your client (and scenario); exit 1 unless it holds."""
    from pathlib import Path

    from middlebox.report.scorecard import scorecard
    from middlebox.run.drills import DrillError, check
    from middlebox.run.outcome import RunError
    from middlebox.scenario.convert import ScenarioError

    try:
        grade = check(
            name,
            list(client_commands),
            fixed_scenario=Path(fixed) if fixed else None,
            report_dir=Path(report_dir) if report_dir else None,
        )
    except (DrillError, RunError, ScenarioError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(scorecard(grade.suite.document(), colour=sys.stdout.isatty()))
    if grade.passed:
        click.echo(f"drill {name}: PASS")
        return
    for reason in grade.reasons:
        click.echo(f"  {reason}", err=True)
    click.echo(f"drill {name}: FAIL", err=True)
    sys.exit(1)


@main.command()
@click.option("--upstream", required=True, help="The real server, e.g. http://127.0.0.1:8000.")
@click.option("--listen", "listen_at", default="127.0.0.1:9000", show_default=True)
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Cassette dir.")
def record(upstream: str, listen_at: str, out: str) -> None:
    """Proxy to a real server and save each response as an emulator cassette.

    \b
    Example:
      middlebox record --upstream http://127.0.0.1:8000 --listen 127.0.0.1:9000 --out tapes/
      # replay one: upstream: {cassette: tapes/cassette-0001-0.json} in a scenario
    """
    from pathlib import Path

    import trio

    from middlebox.shell.server import Address
    from middlebox.tools.record import record as record_responses

    try:
        listen_address, upstream_address = Address.parse(listen_at), Address.parse(upstream)
    except ValueError as error:
        raise click.ClickException(str(error)) from None

    def ready(port: int) -> None:
        click.echo(f"recording http://{listen_address.host}:{port} -> {upstream_address}")
        sys.stdout.flush()

    def saved(path: Path) -> None:
        click.echo(f"saved {path}")
        sys.stdout.flush()

    try:
        trio.run(
            lambda: record_responses(
                listen_address, upstream_address, Path(out), ready=ready, on_cassette=saved
            )
        )
    except KeyboardInterrupt:
        pass


@main.command()
@click.option(
    "--url",
    required=True,
    help="Chat completions URL (through the proxy), e.g. http://127.0.0.1:9000; a bare "
    "host:port URL means /v1/chat/completions.",
)
@click.option("--streams", type=click.IntRange(1, 20000), default=10, show_default=True)
@click.option(
    "--duration",
    type=click.FloatRange(0, 3600, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds during which users start new requests.",
)
@click.option(
    "--model",
    default="middlebox/emulated-7b",
    show_default=True,
    help="Model name to request (the default is the bundled emulator's).",
)
@click.option("--prompt", default="Tell me a story.", show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option(
    "--ramp",
    type=click.FloatRange(0, min_open=True),
    default=100.0,
    show_default=True,
    help="Users started per second.",
)
@click.option("--max-requests", type=click.IntRange(1), default=100_000, show_default=True)
@click.option(
    "--request-timeout",
    type=click.FloatRange(0, min_open=True),
    default=60.0,
    show_default=True,
    help="After --duration, how long requests in flight may take before they are cut.",
)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write the report here.")
def load(
    url: str,
    streams: int,
    duration: float,
    model: str,
    prompt: str,
    max_tokens: int,
    ramp: float,
    max_requests: int,
    request_timeout: float,
    json_file: str | None,
) -> None:
    """Stream many chat completions at once; report TTFT and ITL percentiles at the client.

    Bounded: new requests start for --duration seconds, at most --max-requests in all.
    For distributed load across machines use Locust with `middlebox/tools/locustfile.py`
    (docs/performance.md).

    \b
    Example:
      middlebox load --url http://127.0.0.1:9000 --streams 200 --duration 30
    """
    from pathlib import Path

    import trio

    from middlebox.tools.load import run_load

    try:
        report = trio.run(
            lambda: run_load(
                url,
                streams,
                duration,
                model=model,
                prompt=prompt,
                max_tokens=max_tokens,
                ramp=ramp,
                max_requests=max_requests,
                request_timeout=request_timeout,
            )
        )
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(report.text())
    if json_file:
        Path(json_file).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    if report.completed == 0:
        sys.exit(1)


def _add_optional_commands() -> None:
    try:
        from vllm_emulator.cli import emulate
    except ImportError:  # the emulator arrives in its own change
        return
    main.add_command(emulate, "emulate")


_add_optional_commands()
