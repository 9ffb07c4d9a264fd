"""The `middlebox` command line (click). Thin: each command parses and calls one function."""

from __future__ import annotations

import json
import logging
import sys

import click

from middlebox import __version__

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
      middlebox validate scenarios/
      middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000
    """
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


@main.command(epilog=EPILOG_PROXY)
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
def proxy(
    listen_at: str,
    upstream: str,
    scenario_file: str | None,
    grace: float,
    max_connections: int | None,
    backlog: int,
    journal_file: str | None,
    journal_secrets: bool,
) -> None:
    """Run the proxy: relay every connection byte-exact through the scenario's faults.

    SIGTERM (or Ctrl-C) stops accepting, lets live streams finish for --grace seconds,
    resets the rest, writes the journal if asked, and exits 0.
    """
    import time
    from pathlib import Path

    import trio

    from middlebox.compose import load
    from middlebox.journal import JournalStore
    from middlebox.scenario import Scenario, ScenarioError
    from middlebox.server import Address, ProxyServer, run_proxy

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
    "browser. Default: every available one.",
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
    from middlebox.report import scorecard
    from middlebox.runner import Interrupted, RunError, run_suite
    from middlebox.scenario import ScenarioError

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
        sys.exit(130)  # the shell's convention for a run stopped by SIGINT
    except (RunError, ScenarioError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(scorecard(suite, colour=sys.stdout.isatty()))
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

    from middlebox.report import replay as replay_report
    from middlebox.report import scorecard

    same, differences, suite = replay_report(
        Path(report_file), Path(report_dir) if report_dir else None
    )
    click.echo(scorecard(suite, colour=sys.stdout.isatty()))
    if same:
        click.echo("replay: every verdict identical")
        return
    for line in differences:
        click.echo(f"replay: differs: {line}", err=True)
    sys.exit(1)


def _add_optional_commands() -> None:
    try:
        from vllm_emulator.cli import emulate
    except ImportError:  # the emulator arrives in its own change
        return
    main.add_command(emulate, "emulate")


_add_optional_commands()
