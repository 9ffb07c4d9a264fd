"""`middlebox emulate` / `python -m vllm_emulator`: parse flags, call run_emulator.

The first stdout line is always the readiness banner `listening on http://HOST:PORT`
(flushed; written by `serve.print_banner`), so a parent process that asked for port 0 can
read the port it got.
"""

from __future__ import annotations

import os
import typing

import click

from vllm_emulator.cassette import load_cassette
from vllm_emulator.config import EmulatorConfig, ProfileName, config_from_mapping, load_config
from vllm_emulator.serve import print_banner, run_emulator

EPILOG_EMULATE = """\b
Examples:
  middlebox emulate --port 8000                       # an upstream for middlebox proxy
  middlebox emulate --port 8000 --profile vllm-0.11   # an older vLLM's wire format
  middlebox emulate --config emulator.yaml            # settings in a file (docs/emulator.md)
"""


def build_config(config_file: str | None, profile: str | None) -> EmulatorConfig:
    """The config from `--config FILE` (YAML), with `--profile` winning; its cassette, if
    it names one, read and checked now, so a bad one stops the start (ValueError)."""
    if config_file is not None:
        config = load_config(config_file, profile=profile)
    else:
        config = config_from_mapping({"profile": profile} if profile else {})
    if config.cassette:
        try:
            load_cassette(config.cassette)
        except ValueError as error:
            raise ValueError(f"{config_file}: cassette: {error}") from None
    return config


@click.command("emulate", epilog=EPILOG_EMULATE)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port; 0 picks a free one.")  # fmt: skip
@click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False),
              help="YAML file of emulator settings (see docs/emulator.md).")  # fmt: skip
@click.option("--profile", type=click.Choice(typing.get_args(ProfileName)), default=None,
              help="vLLM version whose wire format to emulate (default vllm-0.33).")  # fmt: skip
def emulate(host: str, port: int, config_file: str | None, profile: str | None) -> None:
    """Run the vLLM emulator: an OpenAI-compatible server that behaves like vLLM."""
    try:
        config = build_config(config_file, profile)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    banner = print_banner(host)
    started: list[int] = []

    def ready(bound: int) -> None:
        started.append(bound)
        banner(bound)

    try:
        run_emulator(config, host, port, ready)
    except OSError as error:
        if started:  # not a start-up failure: the traceback is the useful report
            raise
        raise click.ClickException(listen_error(error, host, port)) from None


def listen_error(error: OSError, host: str, port: int) -> str:
    """A failed listen in one line, as `middlebox proxy` says it (the emulator imports
    nothing of middlebox, so it has its own words): the address, the option, the reason."""
    # aiohttp words a bind error with the address in it; the errno alone says why
    reason = (
        os.strerror(error.errno)
        if error.errno and error.errno > 0
        else str(error.strerror or error)
    )
    shown = f"[{host}]" if ":" in host else host
    return f"cannot listen on {shown}:{port} (--port): {reason.lower()}"
