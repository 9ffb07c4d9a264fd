"""Where the clients' installed parts live: in the source tree, or in the user's cache.

The Node drivers' packages (`npm ci`) and the locked clients' environments are built on first
use. In a source checkout (the package imported from a tree with its pyproject.toml: `pip
install -e .`, `make run`) they stay in the tree, git-ignored, where a developer finds and
removes them (`middlebox/clients/node/node_modules/`, `.clientenvs/`). An installed wheel
never writes into its own folder, which may be read-only, owned by root or shared by several
users: there they go under `$XDG_CACHE_HOME/middlebox` (`~/.cache/middlebox` when unset, as
the XDG Base Directory specification says).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # the `middlebox` package's folder
SOURCE_ROOT = PACKAGE.parent


def in_checkout(root: Path = SOURCE_ROOT) -> bool:
    """The package is imported from a source tree (its pyproject.toml beside it), not from
    site-packages."""
    return (root / "pyproject.toml").is_file()


def cache_root() -> Path:
    """`$XDG_CACHE_HOME/middlebox`; the specification ignores a relative XDG_CACHE_HOME."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "middlebox"
