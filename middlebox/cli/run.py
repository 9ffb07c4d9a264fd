"""`middlebox run`, `scenarios`, `replay` and `drill ...`: scoring clients, each command one
call into `middlebox.run` (or, for `scenarios`, `middlebox.library`), its verdicts shown by
`middlebox.report.scorecard`."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from click.shell_completion import CompletionItem

from middlebox.cli.addresses import PORT
from middlebox.cli.targets import scenario_targets
from middlebox.clients import BUILTIN_CLIENTS, DEFAULT_CLIENTS


def show_scorecard(document: dict[str, Any]) -> None:
    from middlebox.report.scorecard import scorecard

    click.echo(scorecard(document, colour=sys.stdout.isatty()))


@contextmanager
def run_errors(command: str) -> Iterator[None]:
    """A run's errors as exit statuses, each in one line: 2 for a usage error (an unknown
    client, no scenario files, a file that is no report), 1 for a run that cannot go on,
    and the shell's 128 + N for a run stopped by signal N."""
    from middlebox.run.outcome import Interrupted, RunError, UsageError
    from middlebox.scenario.convert import ScenarioError

    try:
        yield
    except Interrupted as error:
        click.echo(f"middlebox {command}: {error}", err=True)
        sys.exit(128 + error.signum)  # 130 for SIGINT, 143 for SIGTERM
    except UsageError as error:
        raise click.UsageError(str(error)) from None
    except (RunError, ScenarioError) as error:
        raise click.ClickException(str(error)) from None


def client_names(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The built-in clients whose names start with what was typed."""
    return [CompletionItem(name) for name in BUILTIN_CLIENTS if name.startswith(incomplete)]


def clients_epilog() -> str:
    """Every built-in client, from the registry, in lines click leaves as they are (its
    wrapping would split a name such as browser-eventsource at its hyphen)."""
    lines = textwrap.wrap(
        ", ".join(BUILTIN_CLIENTS), width=76, break_on_hyphens=False, break_long_words=False
    )
    return "\b\nBuilt-in clients (--client NAME):\n" + "\n".join(f"  {line}" for line in lines)


CLIENT_HELP = (
    "Built-in client to score (repeatable; every one is listed below). Default: "
    f"{', '.join(n for n in DEFAULT_CLIENTS if not n.startswith('browser'))}; the browsers "
    "need Chromium, some others their own environment (built on first use)."
)


@click.command(epilog=clients_epilog())
@click.argument("targets", nargs=-1, callback=scenario_targets)
@click.option("--upstream", help="A real vLLM or gateway URL instead of the embedded emulator.")
@click.option(
    "--client",
    "clients",
    multiple=True,
    shell_complete=client_names,
    help=CLIENT_HELP,
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

    TARGETS are library scenarios by name (`middlebox scenarios` lists them), scenario
    files and directories of them; none runs the whole library. Exits 0 when every
    `expect:` check holds, 1 when one fails or a scenario cannot run, 2 on a usage error.

    \b
    Examples:
      middlebox run                                   # the whole library
      middlebox run nginx-default-buffering --client resilient
      middlebox run reset-mid-stream my-incident.yaml --client-cmd 'mine=python my_client.py'
      middlebox run --client-cmd 'mine=python my_client.py' --report out/
    """
    from middlebox.run.suite import run_suite

    with run_errors("run"):
        suite = run_suite(
            targets,
            client_names=clients,
            client_commands=client_commands,
            seed=seed,
            upstream_url=upstream,
            report_dir=report_dir,
            jobs=jobs,
        )
    show_scorecard(suite.document())
    if report_dir:
        click.echo(
            f"reports: {report_dir}/report.html, {report_dir}/report.json, {report_dir}/junit.xml, "
            f"journals under {report_dir}/runs/"
        )
    if not suite.passed:
        sys.exit(1)


@click.command()
@click.option("--dir", "show_dir", is_flag=True, help="Print the library's folder instead.")
def scenarios(show_dir: bool) -> None:
    """List the scenario library: each scenario's name and what incident it reproduces.

    Every name runs as it is (`middlebox run NAME`, `middlebox_proxy("NAME")` in pytest);
    copy a file from `--dir` to make a scenario of your own.

    \b
    Examples:
      middlebox scenarios
      middlebox run reset-mid-stream --client-cmd 'mine=python my_client.py'
      cp "$(middlebox scenarios --dir)/reset-mid-stream.yaml" my-incident.yaml
    """
    from middlebox.library import catalogue, scenario_dir

    if show_dir:
        click.echo(str(scenario_dir()))
        return
    listed = catalogue()
    width = max(len(name) for name, _ in listed)
    for name, description in listed:
        click.echo(f"{name:<{width}}  {description}")


@click.command()
@click.argument("report_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--report",
    "report_dir",
    type=click.Path(file_okay=False),
    help="Where to write the rerun's reports.",
)
def replay(report_file: str, report_dir: str | None) -> None:
    """Rerun a report.json with the same seeds and clients; fail if any verdict differs.

    Also fails where a request's generated or shown text differs, except shown text where
    the upstream split the same text into other events (its writer lagged: timing, not
    the seed), which is noted. A scenario recorded by a relative path is also looked for
    beside the report and in the folder above it.

    \b
    Example:
      middlebox replay reports/latest/report.json
    """
    from middlebox.run.replay import replay_report

    with run_errors("replay"):
        result = replay_report(Path(report_file), Path(report_dir) if report_dir else None)
    show_scorecard(result.suite.document())
    for line in result.notes:
        click.echo(f"replay: note: {line}")
    if result.same:
        click.echo("replay: every verdict identical")
        return
    for line in result.differences:
        click.echo(f"replay: differs: {line}", err=True)
    sys.exit(1)


def drill_names(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[CompletionItem]:
    """The drills whose names start with what was typed, each with its title."""
    from middlebox.run.drills import all_drills

    return [
        CompletionItem(name, help=drill.title)
        for name, drill in all_drills().items()
        if name.startswith(incomplete)
    ]


@click.group()
def drill() -> None:
    """Training drills: diagnose an incident, then prove the fix.

    \b
    Examples:
      middlebox drill list
      middlebox drill start silent-truncation
      middlebox drill hint silent-truncation 1
      middlebox drill check silent-truncation --client-cmd 'python my_client.py'
    """


@drill.command(
    "list",
    epilog="\b\nExample:\n  middlebox drill list   # then: middlebox drill start NAME",
)
def drill_list() -> None:
    """The drills, and where each one's fix goes."""
    from middlebox.run.drills import listing

    click.echo(listing())


@drill.command(
    "hint",
    epilog="\b\nExamples:\n  middlebox drill hint silent-truncation 1\n"
    "  middlebox drill hint silent-truncation 4   # the last: the fault revealed",
)
@click.argument("name", shell_complete=drill_names)
@click.argument("number", type=int)
def drill_hint(name: str, number: int) -> None:
    """Hint NUMBER (from 1) of drill NAME; the last one reveals the fault."""
    from middlebox.run.drills import DrillError, hint

    try:
        click.echo(hint(name, number))
    except DrillError as error:
        raise click.ClickException(str(error)) from None


@drill.command("start")
@click.argument("name", shell_complete=drill_names)
@click.option("--port", type=PORT, default=0, help="Proxy port (default: a free one).")
@click.option(
    "--control-port",
    type=PORT,
    default=0,
    help="Control API port (default: a free one).",
)
@click.option(
    "--journal",
    type=click.Path(dir_okay=False),
    help="Write every connection's journal (NDJSON) here on Ctrl-C (default: the drill's "
    "scratch directory; the path is printed).",
)
@click.option(
    "--ui-port",
    type=PORT,
    default=0,
    help="The live console's port on 127.0.0.1 (default: a free one; the URL is printed).",
)
@click.option("--no-ui", is_flag=True, help="Run without the live console.")
def drill_start(
    name: str, port: int, control_port: int, journal: str | None, ui_port: int, no_ui: bool
) -> None:
    """Print the symptoms and run the incident (emulator + proxy) until Ctrl-C.

    \b
    Example:
      middlebox drill start mid-stream-reset --port 9000
      curl http://127.0.0.1:CONTROL/journals/1   # the control URL is printed
    """
    from middlebox.cli.proxy import say
    from middlebox.run.drills import DrillError, run_live
    from middlebox.run.processes import UpstreamStartError

    try:
        click.echo(
            run_live(
                name,
                say,
                port=port,
                control_port=control_port,
                journal=Path(journal) if journal else None,
                ui_port=None if no_ui else ui_port,
            )
        )
    except (DrillError, UpstreamStartError) as error:
        raise click.ClickException(str(error)) from None


@drill.command(
    "check",
    epilog="\b\nExamples:\n"
    "  middlebox drill check silent-truncation --client-cmd 'python my_client.py'\n"
    "  middlebox drill check buffered-stream --client-cmd 'python my_client.py' "
    "--scenario fixed.yaml",
)
@click.argument("name", shell_complete=drill_names)
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
    from middlebox.run.drills import DrillError, check

    try:
        with run_errors("drill check"):
            grade = check(
                name,
                list(client_commands),
                fixed_scenario=Path(fixed) if fixed else None,
                report_dir=Path(report_dir) if report_dir else None,
            )
    except DrillError as error:
        raise click.ClickException(str(error)) from None
    show_scorecard(grade.suite.document())
    if grade.passed:
        click.echo(f"drill {name}: PASS")
        return
    for reason in grade.reasons:
        click.echo(f"  {reason}", err=True)
    click.echo(f"drill {name}: FAIL", err=True)
    sys.exit(1)
