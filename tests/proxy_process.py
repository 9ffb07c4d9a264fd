"""A real `middlebox proxy` process for end-to-end tests: started with a scenario's `path:`
in front of a loopback upstream, its port read from `--ready-file`, stopped by its PID
with SIGTERM (killed if it does not drain within a bound); and one request's exchange."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import AnyStr

START_BOUND = 60.0  # seconds: a bound for a loaded machine, not a measurement


@contextmanager
def middlebox_proxy(
    folder: Path, upstream_port: int, path: str, name: str, extra: tuple[str, ...] = ()
) -> Iterator[int]:
    """`middlebox proxy` with the scenario `name` whose `path:` is the YAML list `path`
    (and the options in `extra`, e.g. `--tls`); yields the port it listens on."""
    scenario = folder / f"{name}.yaml"
    scenario.write_text(f"name: {name}\npath:\n{path}")
    ready = folder / f"{name}.ready"
    process = subprocess.Popen(
        [sys.executable, "-m", "middlebox", "proxy", "--listen", "127.0.0.1:0",
         "--upstream", f"http://127.0.0.1:{upstream_port}", "--scenario", str(scenario),
         "--grace", "1", "--ready-file", str(ready), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_BOUND
        while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # another process's start-up, polled
        found = re.search(r"listening on https?://127\.0\.0\.1:(\d+)", ready.read_text())
        assert found is not None
        yield int(found[1])
    finally:
        stop(process)


def exchange(port: int, data: bytes, timeout: float = 10.0) -> bytes:
    """Send `data` to 127.0.0.1:`port` and read to the peer's close (a hang is a timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def stop(
    process: subprocess.Popen[AnyStr], how: int = signal.SIGTERM, bound: float = 30.0
) -> AnyStr | None:
    """Signal the process (its own PID) and reap it, killed if it outlives `bound` seconds;
    what it wrote to its stdout pipe (None without one), read to the end so a full pipe
    cannot hold it."""
    process.send_signal(how)
    try:
        output: AnyStr | None = process.communicate(timeout=bound)[0]
    except subprocess.TimeoutExpired:
        process.kill()
        output = process.communicate(timeout=10)[0]
    return output


@contextmanager
def emulator_process(cwd: Path | None = None) -> Iterator[str]:
    """`python -m vllm_emulator --port 0` with its defaults; yields its base URL (its first
    stdout line names the port)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_emulator", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline().decode()
        assert line.startswith("listening on http://127.0.0.1:"), line
        yield line.split("listening on ", 1)[1].strip()
    finally:
        process.terminate()  # the process started here, by its handle
        process.wait(timeout=10)
