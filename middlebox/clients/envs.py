"""Client environments: a library the matrix scores that is no dependency of middlebox.

`openai` 1.x and 2.x, `langchain-openai`, `litellm`, `anthropic` and `openai-agents` each
run in their own virtual environment, `<env_root>/<name>/`, built on first use from a lock
file of exact versions shipped with the package (`middlebox/clients/locks/<name>.txt`, every
transitive package pinned), like `.venv` from pyproject.toml: a stamp holding the lock
file's digest says the environment is complete and current, so a changed lock rebuilds it
and an interrupted build is redone. The environment sees the `middlebox` package alone,
through a `.pth` file naming a folder that holds one link to the package's folder (the
driver imports only `middlebox.clients` and `middlebox.core`, both standard library only):
never an install of middlebox and its runtime dependencies, nor the rest of the
site-packages an installed middlebox lives in.

Building says so on stderr, once, before the client runs: a build takes tens of seconds,
far longer than a scenario's client bound, so it must never happen inside the bound.
`MIDDLEBOX_CLIENT_ENVS` moves the directory; the default is `.clientenvs/` at the root of
a source tree, `$XDG_CACHE_HOME/middlebox/clientenvs/` for an installed middlebox
(`places`).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from middlebox.clients.places import PACKAGE, SOURCE_ROOT, cache_root, in_checkout

LOCK_DIR = Path(__file__).resolve().parent / "locks"
STAMP = ".middlebox-stamp"


class EnvironmentBuildError(RuntimeError):
    """A client environment could not be built (pip failed, no lock file)."""


@dataclass(frozen=True)
class LockedClient:
    """A built-in client whose library lives in its own environment."""

    name: str
    module: str  # the driver, run as `python -m module name`
    library: str  # the distribution the client drives, for the matrix's version column

    @property
    def lock(self) -> Path:
        return LOCK_DIR / f"{self.name}.txt"


LOCKED_CLIENTS: dict[str, LockedClient] = {
    client.name: client
    for client in (
        LockedClient("openai-v1", "middlebox.clients.openai_sdk_line", "openai"),
        LockedClient("openai-v2", "middlebox.clients.openai_sdk_line", "openai"),
        LockedClient("langchain-openai", "middlebox.clients.langchain_chat", "langchain-openai"),
        LockedClient("litellm", "middlebox.clients.litellm_completion", "litellm"),
        LockedClient("anthropic-messages", "middlebox.clients.anthropic_messages", "anthropic"),
        LockedClient("openai-agents", "middlebox.clients.openai_agents", "openai-agents"),
    )
}


def env_root() -> Path:
    if moved := os.environ.get("MIDDLEBOX_CLIENT_ENVS"):
        return Path(moved)
    return SOURCE_ROOT / ".clientenvs" if in_checkout() else cache_root() / "clientenvs"


def env_dir(name: str) -> Path:
    return env_root() / name


def env_python(name: str) -> Path:
    return env_dir(name) / "bin" / "python"


def lock_digest(lock: Path) -> str:
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def locked_versions(name: str) -> dict[str, str]:
    """`package -> version` from a client's lock file (names lower-cased, `_` as `-`)."""
    versions = {}
    for line in LOCKED_CLIENTS[name].lock.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        package, sep, version = requirement.partition("==")
        if sep:
            versions[package.strip().lower().replace("_", "-")] = version.strip()
    return versions


def library_version(name: str) -> str:
    """The pinned version of the library a locked client drives."""
    return locked_versions(name)[LOCKED_CLIENTS[name].library]


def is_current(name: str) -> bool:
    """The environment exists and was built from the lock file as it is now."""
    stamp = env_dir(name) / STAMP
    lock = LOCKED_CLIENTS[name].lock
    return stamp.is_file() and lock.is_file() and stamp.read_text().strip() == lock_digest(lock)


def argv(name: str) -> list[str]:
    """How the runner starts a locked client (its environment must exist: `ensure`)."""
    return [str(env_python(name)), "-m", LOCKED_CLIENTS[name].module, name]


def ensure(name: str) -> Path:
    """Build `name`'s environment unless it is current; returns its python.

    Two runs building at once (`--jobs`, two terminals) take turns on a lock file, and the
    second finds the first one's stamp."""
    client = LOCKED_CLIENTS[name]
    if not client.lock.is_file():
        raise EnvironmentBuildError(f"no lock file for client {name!r}: {client.lock}")
    if is_current(name):
        return env_python(name)
    env_root().mkdir(parents=True, exist_ok=True)
    with open(env_root() / f".{name}.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not is_current(name):
            _build(client)
    return env_python(name)


def _build(client: LockedClient) -> None:
    target = env_dir(client.name)
    where = _shown(target)
    print(
        f"middlebox: building the {client.name} client's environment in {where} "
        f"from {_shown(client.lock)} (first use; about a minute)",
        file=sys.stderr,
        flush=True,
    )
    shutil.rmtree(target, ignore_errors=True)
    steps = [
        [sys.executable, "-m", "venv", str(target)],
        [
            str(target / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",  # the lock names every package: nothing unpinned slips in
            "-r",
            str(client.lock),
        ],
    ]
    for step in steps:
        done = subprocess.run(step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        if done.returncode != 0:
            tail = done.stdout.decode(errors="replace")[-1500:]
            raise EnvironmentBuildError(
                f"building the {client.name} client's environment failed "
                f"({' '.join(step[:4])} ... exit {done.returncode}):\n{tail}"
            )
    _link_source(target)
    (target / STAMP).write_text(lock_digest(client.lock) + "\n")
    print(f"middlebox: {client.name} client ready ({where})", file=sys.stderr, flush=True)


def _link_source(target: Path) -> None:
    """Put the middlebox package on the environment's path, as `pip install -e` would,
    without installing middlebox's own dependencies there."""
    found = subprocess.run(
        [
            str(target / "bin" / "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    linked = target / "middlebox-source"
    linked.mkdir(exist_ok=True)
    (linked / "middlebox").symlink_to(PACKAGE, target_is_directory=True)
    Path(found.stdout.strip(), "middlebox-source.pth").write_text(f"{linked}\n")


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
