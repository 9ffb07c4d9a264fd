"""Parsing an uploaded scenario (`PUT /scenario`) in a child process, once, within a time
and memory budget, so a hostile or huge body never stalls the relay's event loop.

A thread would not do: it holds the GIL while PyYAML's pure-Python parser runs (seconds
for a 1 MiB body) and cannot be stopped. A child process is killed at `PARSE_TIMEOUT`
and cannot grow past `PARSE_MEMORY` (RLIMIT_AS); the parent only waits on a pipe. At most
`MAX_PARSES` children run at once; `parse_upload` tells the caller when none is free.

The child reads a pickle from stdin (the loader, which names the fault library by
reference, the body and the name problems use) and writes a pickled `Parsed` to stdout.
Both ends are this program: nothing from the peer is unpickled, only the YAML text is
parsed, by PyYAML's SafeLoader.
"""

from __future__ import annotations

import os
import pickle
import resource
import sys
from dataclasses import dataclass
from typing import Any

import trio

from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.model import Scenario

# A 1 MiB scenario of 100,000 values (the loader's limits) parses in ~2 s on one core;
# a loaded CI machine gets several times that before the upload is refused.
PARSE_TIMEOUT = 15.0
# The child's whole address space: the interpreter and the fault library take ~40 MiB,
# the parse of the largest body the loader accepts ~100 MiB more.
PARSE_MEMORY = 512 * 1024 * 1024
MAX_PARSES = 2


@dataclass(frozen=True)
class Parsed:
    """What parsing an upload gave: the scenario, or why it was refused."""

    scenario: Scenario | None = None
    problems: tuple[str, ...] = ()
    error: str = "invalid scenario"


def parse_text(loader: Any, body: bytes, name: str) -> Parsed:
    """Parse `body` here, in this thread (the child's work; tests call it directly)."""
    try:
        return Parsed(loader.text(body.decode("utf-8"), name))
    except UnicodeDecodeError:
        return Parsed(error="the body must be UTF-8 YAML")
    except ScenarioError as error:
        return Parsed(problems=tuple(str(problem) for problem in error.problems))


async def _kill(process: trio.Process) -> None:
    process.kill()  # no grace: the child holds nothing that needs a clean exit


async def parse_in_child(
    loader: Any,
    body: bytes,
    name: str,
    *,
    budget: float = PARSE_TIMEOUT,
    memory: int = PARSE_MEMORY,
) -> Parsed:
    """Parse `body` in a child process, killed after `budget` seconds, limited to `memory` bytes."""
    payload = pickle.dumps((loader, body, name, memory))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    command = [sys.executable, "-m", "middlebox.shell.scenario_parse"]
    with trio.move_on_after(budget) as bound:
        done = await trio.run_process(
            command,
            stdin=payload,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
            deliver_cancel=_kill,
        )
    if bound.cancelled_caught:
        return Parsed(problems=(f"{name}:1:1: not parsed within {budget:g} s; refused",))
    if done.returncode != 0:
        last = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["killed"]
        return Parsed(
            problems=(
                f"{name}:1:1: parsing failed within {memory // (1024 * 1024)} MiB of "
                f"memory ({last[0][:200]}); refused",
            )
        )
    parsed = pickle.loads(done.stdout)
    assert isinstance(parsed, Parsed)
    return parsed


def main() -> None:
    # The data plane comes first: a parse competes for the CPU below the relay (nice 10),
    # so a burst of uploads on a small machine slows the uploads, not the live streams.
    os.nice(10)
    # The payload is at most the control API's 1 MiB body; unpickling the loader imports
    # the fault library (~40 MiB) before the parse's own limit is set.
    loader, body, name, memory = pickle.loads(sys.stdin.buffer.read())
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        parsed = parse_text(loader, body, name)
    except MemoryError:
        sys.stderr.write(f"out of memory (limit {memory} bytes)\n")
        sys.exit(3)
    sys.stdout.buffer.write(pickle.dumps(parsed))


if __name__ == "__main__":
    # Through the module's own name, so the `Parsed` pickled is the one the parent reads
    # (run as `-m`, this file's classes are `__main__`'s).
    from middlebox.shell import scenario_parse

    scenario_parse.main()
