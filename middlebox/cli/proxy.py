"""`middlebox proxy`: options parsed into `ProxySettings`, served by `middlebox.run.serve`."""

from __future__ import annotations

import errno
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click

from middlebox.cli.addresses import listen_address, upstream_address
from middlebox.cli.targets import scenario_file

EPILOG_PROXY = """\b
Examples:
  middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000
  middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000 \\
      --scenario nginx-default-buffering
"""


def say(line: str) -> None:
    """One line on stdout, flushed: the first is the readiness banner a parent waits for."""
    click.echo(line)
    sys.stdout.flush()


# How long the start-up probe of the upstream waits: long enough for a loopback or LAN
# server to accept, short enough not to delay the proxy noticeably.
UPSTREAM_PROBE_TIMEOUT = 1.0

# What a failed listen usually means and what to do, by errno (bind(2), listen(2)).
LISTEN_ADVICE = {
    errno.EADDRINUSE: "address already in use (another proxy or server has it: stop it, or "
    "pick another port; port 0 picks a free one)",
    errno.EACCES: "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)",
    errno.EADDRNOTAVAIL: "address not available on this machine (check the host)",
}


def startup_error(error: BaseException, listen_at: str, option: str = "--listen") -> str | None:
    """A start-up failure in one line (a busy port, a bad address) naming the address and
    the option that set it, or None when the error is not one (then the traceback is the
    useful report). Trio may wrap the OSError in an exception group. A ListenError says
    which of the proxy's listeners failed, and so which option to name; any other OSError
    is `listen_at`'s, set by `option`."""
    from middlebox.shell.server import ListenError

    found: list[OSError] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, OSError):
            found.append(exc)
        for inner in getattr(exc, "exceptions", ()):
            walk(inner)

    walk(error)
    if not found:
        return None
    first = found[0]
    if isinstance(first, ListenError):
        listen_at, option = str(first.address), f"--{first.role}"
    reason = LISTEN_ADVICE.get(first.errno or 0, first.strerror or str(first))
    return f"cannot listen on {listen_at} ({option}): {reason}"


def upstream_problem(upstream: str, timeout: float = UPSTREAM_PROBE_TIMEOUT) -> str | None:
    """Why the upstream cannot be reached now (a TCP connect to its host and port), or
    None. Only a warning: the proxy still starts, as nginx does, and answers 502 meanwhile."""
    parts = urlsplit(upstream)
    host = parts.hostname or "127.0.0.1"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as error:
        return f"upstream {upstream}: {error}"
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        return (
            f"upstream {upstream} is not reachable now ({reason.lower()}): clients get "
            "the scenario's on_upstream_unreachable answer (nginx's 502) until it is"
        )


def ready_file_writer(path: str | None, say: Callable[[str], None]) -> Callable[[str], None]:
    """`say` that also writes the readiness line (`listening on http://...`) to `path`
    once, atomically (written aside, then renamed), so a script can wait for the file
    instead of guessing how long start-up takes."""
    if path is None:
        return say
    target = Path(path)
    written = False

    def say_and_mark(line: str) -> None:
        nonlocal written
        say(line)
        if not written and line.startswith("listening on "):
            aside = target.with_name(f".{target.name}.{os.getpid()}")
            aside.write_text(line + "\n", encoding="utf-8")
            aside.replace(target)
            written = True

    return say_and_mark


@click.command(epilog=EPILOG_PROXY)
@click.option(
    "--listen",
    "listen_at",
    default="127.0.0.1:9000",
    show_default=True,
    callback=listen_address,
    help="HOST:PORT to accept clients on (port 0 picks a free port).",
)
@click.option(
    "--upstream",
    required=True,
    callback=upstream_address,
    help="URL of the LLM server, e.g. http://127.0.0.1:8000.",
)
@click.option(
    "--scenario",
    "scenario_file",
    callback=scenario_file,
    help="YAML scenario (a file, or a library scenario's name) whose `path:` faults every "
    "connection goes through.",
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
    help="Write the connection journal (NDJSON) here as the proxy goes: each connection "
    "appended when it ends, open ones at least every second; secrets redacted.",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    help="Write the 'listening on http://HOST:PORT ...' line to this file once the proxy "
    "accepts connections (scripts wait for it).",
)
@click.option(
    "--journal-secrets",
    is_flag=True,
    help="Keep Authorization/API-key/cookie values in the journal (redacted by default).",
)
@click.option(
    "--journal-max-bytes",
    metavar="SIZE",
    default="1GiB",
    show_default=True,
    help="Cap on the --journal file (512MiB, 2GiB...); records past it are dropped and "
    "counted in its closing totals line.",
)
@click.option(
    "--redact-name",
    "redact_names",
    multiple=True,
    metavar="NAME",
    help="A header, query parameter or JSON field name to redact besides the built-in "
    "rule (names saying key, token, secret, auth...); repeatable.",
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
    callback=listen_address,
    help="Serve the control API here (GET /metrics, GET|PUT|DELETE /scenario, "
    "GET /journals...). Loopback unless a token is given.",
)
@click.option(
    "--ui",
    metavar="HOST:PORT",
    callback=listen_address,
    help="Serve the live web console here (docs/ui.md): every stream's two sides as they "
    "flow, the faults firing, and the fault list to edit. Loopback unless a token is given.",
)
@click.option(
    "--drill",
    metavar="NAME",
    hidden=True,
    help="The drill the console shows (set by `middlebox drill start`).",
)
@click.option(
    "--control-token",
    envvar="MIDDLEBOX_CONTROL_TOKEN",
    help="Bearer token the control API and the console require (env "
    "MIDDLEBOX_CONTROL_TOKEN); mandatory on a non-loopback address.",
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
@click.option(
    "--tls",
    is_flag=True,
    help="Terminate TLS toward clients (ALPN h2 and http/1.1) with a certificate from "
    "middlebox's local CA; the banner names the CA file to trust.",
)
@click.option(
    "--ca-dir",
    type=click.Path(file_okay=False),
    help="Where the local CA lives (created on first use; default $MIDDLEBOX_CA_DIR or "
    "~/.local/share/middlebox/ca).",
)
@click.option(
    "--upstream-insecure",
    is_flag=True,
    help="Do not verify an https:// upstream's certificate (verified by default).",
)
@click.option(
    "--upstream-ca",
    type=click.Path(exists=True, dir_okay=False),
    help="A CA file (PEM) an https:// upstream's certificate may chain to, besides the system's.",
)
@click.option(
    "--tls-keylog",
    type=click.Path(dir_okay=False),
    help="Append the TLS session keys (NSS key log lines, SSLKEYLOGFILE's format) to FILE, "
    "so Wireshark or tshark (-o tls.keylog_file:FILE) decrypts a capture of both legs.",
)
@click.option(
    "--state",
    metavar="URL",
    help="Keep cross-connection fault state (match first:/every:, one handoff) in this "
    "Redis (redis://HOST:PORT/DB), shared by every proxy pointed at it; default: this "
    "process, one state for all --workers.",
)
def proxy(
    listen_at: str,
    upstream: str,
    journal_max_bytes: str,
    ready_file: str | None,
    tls_keylog: str | None,
    drill: str | None,
    **options: Any,
) -> None:
    """Run the proxy: relay every connection byte-exact through the scenario's faults.

    SIGTERM (or Ctrl-C) stops accepting, lets live streams finish for --grace seconds,
    resets the rest, writes the journal if asked, and exits 0.
    """
    from middlebox.run.serve import OptionConflict, ProxySettings, SettingsError, serve
    from middlebox.scenario.units import parse_size

    try:
        max_bytes = parse_size(journal_max_bytes)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--journal-max-bytes") from None
    # Every other option is named as its ProxySettings field (click's parameter names).
    settings = ProxySettings(
        listen=listen_at, upstream=upstream, journal_max_bytes=max_bytes, **options
    )
    if tls_keylog:
        # Through the environment, so every --workers process inherits it (shell/tls.py).
        os.environ["SSLKEYLOGFILE"] = os.path.abspath(tls_keylog)
    problem = upstream_problem(upstream)
    if problem:
        click.echo(f"warning: {problem}", err=True)
    shown: list[str] = []  # lines said so far: none yet means it failed starting up
    say_ready = ready_file_writer(ready_file, say)

    def show(line: str) -> None:
        shown.append(line)
        say_ready(line)

    drill_state = None
    if drill:
        from middlebox.run.drills import DrillError, console_state

        try:
            drill_state = console_state(drill)
        except DrillError as error:
            raise click.BadParameter(str(error), param_hint="--drill") from None
    try:
        click.echo(serve(settings, show, drill=drill_state))
    except OptionConflict as error:
        raise click.UsageError(str(error)) from None
    except SettingsError as error:
        raise click.ClickException(str(error)) from None
    except (OSError, BaseExceptionGroup) as error:
        line = None if shown else startup_error(error, listen_at)
        if line is None:
            raise
        raise click.ClickException(line) from None
