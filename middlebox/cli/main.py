"""The `middlebox` command line (click): the group, and the commands of each module.

Thin: each command parses its options and calls one importable function; the commands live
by group in `cli/proxy.py` (the proxy), `cli/run.py` (run, scenarios, replay, drills) and
`cli/tools.py` (validate, schema, pcap, record, load, probe-upstream); `cli/targets.py` is the
scenario argument (a path or a library name), `cli/addresses.py` the HOST:PORT and port
options (a port out of range is a usage error). `main` is the console script
(pyproject: `middlebox = "middlebox.cli.main:main"`).
"""

from __future__ import annotations

import logging

import click

from middlebox import __version__
from middlebox.cli.proxy import proxy
from middlebox.cli.run import drill, replay, run, scenarios
from middlebox.cli.tools import (
    fingerprint,
    load,
    pcap,
    probe_upstream,
    record,
    schema,
    validate,
)
from middlebox.shell.lifetime import interruptible


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="middlebox")
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
def main(verbose: int) -> None:
    """middlebox: inject the faults real networks inflict on LLM token streams, and score
    how the client and the server cope.

    \b
    Examples:
      middlebox run --report out/                 # the main job: score the whole library
      middlebox scenarios                         # the library, each name runnable as is
      middlebox run reset-mid-stream --client-cmd 'mine=python my_client.py'
      middlebox validate my-incident.yaml
      middlebox proxy --listen 127.0.0.1:9000 --upstream http://127.0.0.1:8000
    """
    # The documented Ctrl-C of `drill start`, `proxy --workers` or `record` works however
    # the command was started (a background job inherits SIGINT ignored).
    interruptible()
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")


# In the order of the old single-module command line (help lists them sorted anyway).
for command in (
    proxy,
    validate,
    schema,
    run,
    scenarios,
    replay,
    pcap,
    drill,
    record,
    load,
    probe_upstream,
    fingerprint,
):
    main.add_command(command)


def _add_optional_commands() -> None:
    try:
        from vllm_emulator.cli import emulate
    except ImportError:  # the emulator arrives in its own change
        return
    main.add_command(emulate, "emulate")


_add_optional_commands()
