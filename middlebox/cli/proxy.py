"""`middlebox proxy`: options parsed into `ProxySettings`, served by `middlebox.run.serve`."""

from __future__ import annotations

import sys

import click

EPILOG_PROXY = """\b
Examples:
  middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000
  middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000 \\
      --scenario scenarios/nginx-default-buffering.yaml
"""


def say(line: str) -> None:
    """One line on stdout, flushed: the first is the readiness banner a parent waits for."""
    click.echo(line)
    sys.stdout.flush()


@click.command(epilog=EPILOG_PROXY)
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
@click.option(
    "--control",
    metavar="HOST:PORT",
    help="Serve the control API here (GET /metrics, GET|PUT|DELETE /scenario, "
    "GET /journals...). Loopback unless a token is given.",
)
@click.option(
    "--control-token",
    envvar="MIDDLEBOX_CONTROL_TOKEN",
    help="Bearer token the control API requires (env MIDDLEBOX_CONTROL_TOKEN); "
    "mandatory on a non-loopback address.",
)
@click.option(
    "--allow-scenario-header",
    is_flag=True,
    help="Let a connection pick NAME.yaml from --scenario-dir with the request "
    "header X-Middlebox-Scenario: NAME (off by default).",
)
@click.option(
    "--scenario-dir",
    type=click.Path(exists=True, file_okay=False),
    help="Scenarios X-Middlebox-Scenario may name.",
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
    control: str | None,
    control_token: str | None,
    allow_scenario_header: bool,
    scenario_dir: str | None,
) -> None:
    """Run the proxy: relay every connection byte-exact through the scenario's faults.

    SIGTERM (or Ctrl-C) stops accepting, lets live streams finish for --grace seconds,
    resets the rest, writes the journal if asked, and exits 0.
    """
    from middlebox.run.serve import OptionConflict, ProxySettings, SettingsError, serve

    settings = ProxySettings(
        listen=listen_at,
        upstream=upstream,
        scenario_file=scenario_file,
        grace=grace,
        max_connections=max_connections,
        backlog=backlog,
        journal_file=journal_file,
        journal_secrets=journal_secrets,
        workers=workers,
        control=control,
        control_token=control_token,
        allow_scenario_header=allow_scenario_header,
        scenario_dir=scenario_dir,
    )
    try:
        click.echo(serve(settings, say))
    except OptionConflict as error:
        raise click.UsageError(str(error)) from None
    except SettingsError as error:
        raise click.ClickException(str(error)) from None
