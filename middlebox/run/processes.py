"""Child processes: the one upstream launcher, and the supervisor that stops what a run started.

The launcher: `UpstreamProcess` starts a server process on 127.0.0.1 and a free port and
reads its readiness from its own stdout. `EmulatorProcess` is it for the embedded
`python -m vllm_emulator`, whose first stdout line is `listening on http://HOST:PORT`
(written and flushed by `vllm_emulator/cli.py`; `emulator_url` is the one place that line
is read). Everything that needs an emulator (the runner, the pytest plugin, drills, soak,
bench, calibrate) starts it here. The launcher is synchronous (`subprocess.Popen` and a
reader thread) so plain scripts can use it; trio code calls `start_emulator`, which runs
it in a worker thread and registers the process with the run's `Children`.

Each child starts in its own session, so it leads its own process group and a signal to
the group reaches whatever it started in turn (a shell wrapper's client, a browser's
helpers). A group is signalled only while its leader is unreaped, so a recycled pid is
never hit. And each child dies with this process (`middlebox.shell.lifetime.spawn`: the
kernel sends it SIGTERM when this process goes, a SIGKILL included), so a killed run or
drill leaves no emulator, proxy or client holding its port.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import trio
import yaml

from middlebox.scenario.model import Scenario
from middlebox.shell.lifetime import spawn

UPSTREAM_START_TIMEOUT = 30.0
CHILD_STOP_GRACE = 5.0
EMULATOR_BANNER = "listening on "


class UpstreamStartError(RuntimeError):
    """The upstream process exited or said nothing usable before it was ready.

    `cause` is the line of its output that says why (its last error line: click's
    `Error: ...`, a traceback's `FileNotFoundError: ...`), `status` its exit status (None
    when it was still running at the deadline), `output` everything it said."""

    def __init__(self, message: str, *, cause: str = "", status: int | None = None,
                 output: str = "") -> None:  # fmt: skip
        super().__init__(message)
        self.cause = cause
        self.status = status
        self.output = output


ERROR_WORDS = ("error", "exception", "traceback", "fatal")


def last_error_line(output: str) -> str:
    """The line of a process's output that says why it stopped: the last one naming an
    error (click ends with `Error: ...`, a traceback with `SomeError: ...`), else the last
    line it wrote."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        lowered = line.lower()
        if (
            any(word in lowered for word in ERROR_WORDS)
            and lowered != "traceback (most recent call last):"
        ):
            return line
    return lines[-1] if lines else "(it wrote nothing)"


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


class UpstreamProcess:
    """A server process whose stdout announces where it listens.

    `ready` reads one stdout line and returns the server's base URL once the line says it
    is ready (None: keep reading). After that, stdout is copied to `log` (or discarded) by
    a thread, so a chatty server never blocks on a full pipe. `stop()` ends the process's
    group: SIGTERM, then SIGKILL after `grace`."""

    def __init__(
        self,
        argv: Sequence[str],
        ready: Callable[[str], str | None],
        *,
        log: Path | None = None,
        cwd: Path | None = None,
        timeout: float = UPSTREAM_START_TIMEOUT,
        what: str = "the upstream",
    ) -> None:
        self.argv = list(argv)
        self.log = log
        self.process = spawn(
            self.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )
        self.url = ""
        seen: list[bytes] = []
        found = threading.Event()

        def read_until_ready() -> None:
            assert self.process.stdout is not None
            for line in self.process.stdout:
                seen.append(line)
                url = ready(line.decode(errors="replace"))
                if url is not None:
                    self.url = url
                    found.set()
                    self._drain(self.process.stdout)
                    return
            found.set()  # EOF: it exited before it was ready

        threading.Thread(target=read_until_ready, name="upstream-stdout", daemon=True).start()
        found.wait(timeout)
        if not self.url:
            raise self._start_error(what, timeout, b"".join(seen).decode(errors="replace"))

    def _start_error(self, what: str, timeout: float, said: str) -> UpstreamStartError:
        """Stop the child and say why it did not start: the exit status and its last error
        line (all it said goes to the log, where the rest of its output would have)."""
        try:
            status: int | None = self.process.wait(1.0)  # it closed stdout: reap it
        except subprocess.TimeoutExpired:
            status = None
        self.stop()
        if self.log is not None:
            with self.log.open("a", encoding="utf-8") as log:
                log.write(said)
        cause = last_error_line(said)
        if status is None:
            head = f"{what} was not ready within {timeout:g}s"
        else:
            head = f"{what} exited at start (exit status {status})"
        where = f" (its output: {self.log})" if self.log is not None else ""
        return UpstreamStartError(
            f"{head}: {cause}{where}", cause=cause, status=status, output=said
        )

    def _drain(self, stdout: IO[bytes]) -> None:
        if self.log is None:
            for _ in stdout:
                pass
            return
        with self.log.open("ab") as log:
            for line in stdout:
                log.write(line)
                log.flush()

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.process.poll() is None:
            _signal_group(self.process.pid, signum)

    def stop(self, grace: float = CHILD_STOP_GRACE) -> None:
        """SIGTERM the group, wait up to `grace`, then SIGKILL it; reaps the process."""
        if self.process.poll() is None:
            self.signal(signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.process.wait()


def emulator_url(line: str) -> str | None:
    """The base URL in the emulator's readiness line, or None for any other line."""
    if not line.startswith(EMULATOR_BANNER + "http://"):
        return None
    return line[len(EMULATOR_BANNER) :].split()[0]


def emulator_config(scenario: Scenario, seed: int) -> dict[str, Any]:
    """The emulator's settings: the scenario's `upstream:` block, seeded by the run.

    The run's seed (the scenario's `seed:`, or `--seed`) is the emulator's seed: the
    loaded block is an `EmulatorConfig` that always holds a `seed` (0 by default), so a
    `setdefault` would never let the run's seed through and every run would generate
    the same text whatever its seed."""
    upstream: Any = scenario.sections.get("upstream")
    if dataclasses.is_dataclass(upstream) and not isinstance(upstream, type):
        config = dataclasses.asdict(upstream)
    else:
        config = dict(upstream or {})
    config["seed"] = seed
    return config


class EmulatorProcess(UpstreamProcess):
    """`python -m vllm_emulator` on 127.0.0.1, a free port, and `config` (the mapping of a
    scenario's `upstream:` block) written as `directory/NAME.yaml`; its log goes to
    `directory/NAME.log` when `keep_log`."""

    def __init__(
        self,
        config: Mapping[str, Any],
        directory: Path,
        *,
        name: str = "emulator",
        keep_log: bool = True,
        cwd: Path | None = None,
        timeout: float = UPSTREAM_START_TIMEOUT,
    ) -> None:
        config_file = directory / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(dict(config), sort_keys=True))
        argv = [sys.executable, "-m", "vllm_emulator", "--host", "127.0.0.1", "--port", "0",
                "--config", str(config_file)]  # fmt: skip
        super().__init__(
            argv,
            emulator_url,
            log=directory / f"{name}.log" if keep_log else None,
            cwd=cwd,
            timeout=timeout,
            what="the emulator",
        )


# ------------------------------------------------------------- the supervisor


class ChildProcess:
    """A child started from trio (`Children.start`): `spawn`'s process, waited for without
    blocking the loop. Not `trio.lowlevel.open_process`, which forks from a worker thread,
    whose exit would send the child its parent-death signal (`middlebox.shell.lifetime`)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.pid = popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    async def wait(self) -> int:
        """Its exit status, once it has exited (a pidfd becomes readable then, Linux 5.3)."""
        if self.popen.poll() is None:
            try:
                pidfd = os.pidfd_open(self.pid)
            except (OSError, AttributeError):  # reaped meanwhile, or no pidfd: a thread waits
                await trio.to_thread.run_sync(self.popen.wait, abandon_on_cancel=True)
            else:
                try:
                    await trio.lowlevel.wait_readable(pidfd)
                finally:
                    os.close(pidfd)
        return self.popen.wait()


class Children:
    """Every process a run starts, so an interrupted run leaves none behind."""

    def __init__(self) -> None:
        self.processes: set[ChildProcess] = set()
        self.upstreams: set[UpstreamProcess] = set()
        self.started = 0  # every process ever started or adopted, for the interrupted message

    async def start(self, argv: Sequence[str], **options: Any) -> ChildProcess:
        """`argv` in a session of its own, dying with this process; forked off the loop."""
        popen = await trio.to_thread.run_sync(
            lambda: spawn(argv, start_new_session=True, **options)
        )
        process = ChildProcess(popen)
        self.processes.add(process)
        self.started += 1
        return process

    def kill_group(self, process: ChildProcess) -> None:
        """SIGKILL `process` and every process of the session it leads (`start` made it
        one): what a client started, a Chromium, a node, goes with it, where killing the
        client alone orphans them (a hung browser client left Chromium running)."""
        _signal_group(process.pid, signal.SIGKILL)

    def adopt(self, upstream: UpstreamProcess) -> None:
        """Supervise an upstream started by the launcher (outside trio)."""
        self.upstreams.add(upstream)
        self.started += 1

    def signal_all(self, signum: int) -> None:
        for process in self.processes:
            if process.poll() is None:
                _signal_group(process.pid, signum)
        for upstream in self.upstreams:
            upstream.signal(signum)

    async def stop_all(self, grace: float = CHILD_STOP_GRACE) -> None:
        """SIGTERM every live group, wait up to `grace`, then SIGKILL; shielded, so it
        completes even while the run is being cancelled."""
        with trio.CancelScope(shield=True):
            self.signal_all(signal.SIGTERM)
            with trio.move_on_after(grace):
                for process in list(self.processes):
                    await process.wait()
                for upstream in list(self.upstreams):
                    # abandoned at the deadline, so a child ignoring SIGTERM cannot hold us
                    await trio.to_thread.run_sync(upstream.process.wait, abandon_on_cancel=True)
            self.signal_all(signal.SIGKILL)
            for process in list(self.processes):
                await process.wait()
            for upstream in list(self.upstreams):
                await trio.to_thread.run_sync(upstream.process.wait)
            self.processes.clear()
            self.upstreams.clear()


_DEFAULT_CHILDREN = Children()
CHILDREN: contextvars.ContextVar[Children] = contextvars.ContextVar(
    "middlebox_children", default=_DEFAULT_CHILDREN
)


async def start_emulator(config: Mapping[str, Any], directory: Path) -> EmulatorProcess:
    """The launcher from trio: started in a worker thread, supervised by the run's
    `Children` (so SIGINT during a run stops it too)."""
    emulator = await trio.to_thread.run_sync(lambda: EmulatorProcess(config, directory))
    CHILDREN.get().adopt(emulator)
    return emulator


async def stop_upstream(upstream: UpstreamProcess) -> None:
    """Stop it without blocking the trio loop (shielded: this is cleanup)."""
    with trio.CancelScope(shield=True):
        await trio.to_thread.run_sync(upstream.stop)
    CHILDREN.get().upstreams.discard(upstream)
