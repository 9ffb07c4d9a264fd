"""One client under test: its own proxy, its process, its workload file, its result.

Each client gets its own proxy, so cross-connection fault state (such as "the first
three requests get a 429") applies to each client alike. The client runs as a separate
process under the contract in `middlebox.clients` (environment in, result file out),
bounded by the workload's timeout; a client still running then is a hang.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from middlebox.clients import BUILTIN_CLIENTS, available_clients
from middlebox.clients.result_file import ResultError, read_result
from middlebox.observe.journal import JournalStore
from middlebox.run.outcome import UsageError
from middlebox.run.processes import CHILDREN
from middlebox.run.serve import proxy_config
from middlebox.scenario.model import Scenario
from middlebox.scenario.workload import Workload, request_tag, workload_file
from middlebox.shell.server import Address, ProxyServer, listen
from middlebox.shell.tls import LocalCA

# after the client exits, how long the proxy may carry the last closes to the upstream
PROXY_SETTLE = 2.0


@dataclass
class ClientSpec:
    name: str
    argv: list[str]


def default_clients() -> list[str]:
    """Every built-in client but the browsers: starting Chromium per scenario is slow and
    heavy, so a browser is scored when asked for (`--client browser`)."""
    return [name for name in available_clients() if not name.startswith("browser")]


def resolve_clients(names: Sequence[str], commands: Sequence[str]) -> list[ClientSpec]:
    """Built-in client names plus `--client-cmd` commands (`NAME=COMMAND` or `COMMAND`)."""
    specs = []
    for name in names:
        if name not in BUILTIN_CLIENTS:
            raise UsageError(
                f"unknown client {name!r}; built-in clients: {', '.join(BUILTIN_CLIENTS)}"
            )
        specs.append(ClientSpec(name, list(BUILTIN_CLIENTS[name])))
    for number, command in enumerate(commands, start=1):
        name, sep, rest = command.partition("=")
        # NAME=COMMAND for any NAME without whitespace (`own-openai=python x.py`), else
        # the whole text is the command
        if not (sep and name and not any(c.isspace() for c in name)):
            name, rest = f"custom{number if len(commands) > 1 else ''}", command
        specs.append(ClientSpec(name, _client_argv(command, rest)))
    return specs


def _client_argv(command: str, text: str) -> list[str]:
    """A `--client-cmd` command as argv, or a UsageError (one clear line) when it is empty,
    cannot be split or names a program that cannot be found."""
    try:
        argv = shlex.split(text)
    except ValueError as error:
        raise UsageError(f"--client-cmd {command!r}: {error}") from None
    if not argv:
        raise UsageError(f"--client-cmd {command!r}: no command to run (NAME=COMMAND or COMMAND)")
    if shutil.which(argv[0]) is None and not os.access(argv[0], os.X_OK):
        raise UsageError(
            f"--client-cmd {command!r}: {argv[0]!r} is not an executable program "
            f"(give NAME=COMMAND or COMMAND, e.g. 'mine=python my_client.py')"
        )
    return argv


@dataclass
class ClientRun:
    spec: ClientSpec
    tags: list[str]
    journal: JournalStore
    result: dict[str, Any] | None = None
    # why the result file it wrote cannot be scored (it breaks the contract); None when
    # it wrote none, or one that keeps the contract
    result_error: str | None = None
    hang: bool = False
    stderr_tail: str = ""
    exit_status: int | None = None  # negative: killed by that signal (Popen's convention)
    server_metrics: dict[str, Any] = field(default_factory=dict)
    # a real server's /metrics around this client: (wall time, running, generation tokens)
    samples: list[tuple[float, float, float]] = field(default_factory=list)
    # where its files went (a re-take's own folder), and, against a real server, every
    # take of this client with its disturbance (middlebox.run.takes)
    workdir: Path | None = None
    takes: list[dict[str, Any]] = field(default_factory=list)
    # a re-take's own emulator's ledger (None: the scenario's, shared by its clients)
    ledger: list[dict[str, Any]] | None = None

    def missing_result(self) -> str:
        """Why a client that did not hang has no result, in one line: what is wrong with
        the result file it wrote, or how its process ended and the end of its stderr (or
        that its stderr was empty)."""
        if self.result_error is not None:
            return (
                f"its result file breaks the client contract (docs/clients.md, Result): "
                f"{self.result_error}"
            )
        status = self.exit_status
        if status is None:
            ended = ""
        elif status < 0:
            ended = f" (it was killed by signal {signal_name(-status)})"
        else:
            ended = f" (it exited with status {status})"
        said = self.stderr_tail[-400:].strip()
        tail = f"its stderr ends with: {said}" if said else "its stderr was empty"
        return f"the client wrote no result{ended}; {tail}"


def signal_name(number: int) -> str:
    """`SIGKILL` for 9; the number for a signal without a name (a real-time one)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return str(number)


def tls_client_env(scenario: Scenario, port: int) -> dict[str, str]:
    """A scenario with `proxy: {tls: ...}` (docs/tls-http2.md): the clients get an https://
    URL and the local CA to trust (SSL_CERT_FILE: OpenSSL, httpx and aiohttp read it;
    MIDDLEBOX_CA_FILE for a client that sets its own trust, like the browser's)."""
    tls = scenario.proxy.tls
    if tls is None:
        return {}
    ca = str(LocalCA.load_or_create(tls.ca_dir).cert_path)
    return {
        "OPENAI_BASE_URL": f"https://127.0.0.1:{port}/v1",
        "SSL_CERT_FILE": ca,
        "MIDDLEBOX_CA_FILE": ca,
    }


async def run_client(
    spec: ClientSpec,
    scenario: Scenario,
    workload: Workload,
    upstream: Address,
    model: str,
    workdir: Path,
    body_extra: dict[str, Any] | None = None,
) -> ClientRun:
    """One proxy, one client process, bounded by the workload timeout. `body_extra` is
    added to every request body (against a real vLLM: `ignore_eos`, see suite.py)."""
    journal = JournalStore(capture=True)
    server = ProxyServer(proxy_config(upstream, scenario, journal=journal))
    document = workload_file(workload, scenario.name, spec.name, model)
    for request in document["requests"]:
        request["body"].update(body_extra or {})
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
            **tls_client_env(scenario, port),
        }
        with stderr_path.open("wb") as stderr:
            process = await CHILDREN.get().start(spec.argv, env=env, stdout=stderr, stderr=stderr)
            with trio.move_on_after(workload.timeout) as bound:
                run.exit_status = await process.wait()
            if bound.cancelled_caught:
                run.hang = True
                # the session we started it in: its own children too (a browser client's
                # Chromium outlived a SIGKILL of the client alone, at nice -8, for minutes)
                CHILDREN.get().kill_group(process)
                await process.wait()
        with trio.move_on_after(PROXY_SETTLE):
            await server.wait_idle()
        nursery.cancel_scope.cancel()
    listener.close()
    if result_path.exists():
        try:
            run.result = read_result(result_path.read_bytes(), workload.requests)
        except ResultError as error:
            run.result_error = str(error)
    run.stderr_tail = stderr_path.read_text(errors="replace")[-2000:]
    return run
