"""The scenario argument of `run`, `validate` and `proxy --scenario`: a path or a library name.

A file or directory that exists as given is taken as it is; anything else must be a library
scenario's name (`middlebox scenarios`), which becomes its file in the installed package.
A target that is neither is a usage error (exit 2) naming the closest library scenarios.
Click callbacks rather than a ParamType: ParamType became generic in click 8.2, and the
callbacks read the same under every click pyproject allows.
"""

from __future__ import annotations

from pathlib import Path

import click


def _resolved(value: str) -> Path:
    from middlebox.library import UnknownScenario, resolve

    try:
        return resolve(value)
    except UnknownScenario as error:
        raise click.BadParameter(str(error)) from None


def scenario_targets(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    """Files, directories of them, or library names: each as a path."""
    return tuple(str(_resolved(value)) for value in values)


def scenario_file(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """One scenario: a file or a library name (a directory is refused)."""
    if value is None:
        return None
    path = _resolved(value)
    if path.is_dir():
        raise click.BadParameter(f"{value}: a directory; give one scenario file or name")
    return str(path)
