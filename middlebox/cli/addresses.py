"""The address and port options, checked as click parses them.

A port out of range, or an address that is neither HOST:PORT nor an http(s) URL, is a usage
error naming the option (exit 2) before anything starts: nothing probes, binds or keeps only
a port's low bits. `Address.parse` (shell/server.py) is the one parser of addresses; these
callbacks turn its ValueError into click's. Click callbacks rather than a ParamType, as in
`cli/targets.py`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from middlebox.shell.server import Address

# A port to listen on (TCP's 16 bits); 0 asks the kernel for a free one.
PORT = click.IntRange(0, 65535)


def _parsed(value: str) -> Address:
    # Imported here: the shell pulls in trio, which `middlebox --help` does without.
    from middlebox.shell.server import Address

    try:
        return Address.parse(value)
    except ValueError as error:
        raise click.BadParameter(str(error)) from None


def listen_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """HOST:PORT to listen on (port 0 picks a free one), as given."""
    if value is not None:
        _parsed(value)
    return value


def upstream_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """An upstream's URL or HOST:PORT, as given: one to dial, so port 0 is refused too."""
    if value is not None and _parsed(value).port == 0:
        raise click.BadParameter(f"expected a port from 1 to 65535 to connect to, got {value!r}")
    return value
