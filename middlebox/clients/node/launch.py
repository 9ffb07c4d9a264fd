"""`python -m middlebox.clients.node.launch NAME`: install the Node packages once, run a driver.

The first run (or the first after package-lock.json changed) says so on stderr and runs
`npm ci`, under a file lock so that clients started in parallel install once; a stamp inside
node_modules/ holds the lockfile's hash. In a source checkout that is this folder. An
installed wheel writes nothing into site-packages: the drivers, package.json and the lockfile
are copied to a folder of the user's cache named by their digest
(`$XDG_CACHE_HOME/middlebox/node/DIGEST/`, `places.cache_root`), installed and run there,
because Node resolves a driver's imports from the driver's own folder upwards (ES modules
ignore NODE_PATH). Then the process becomes `node DRIVER.mjs` (exec), so the runner's SIGTERM
and exit status are the driver's own. Exit 2 for an unknown name (a contract violation, as
the drivers use), 1 when Node or the install is missing or fails.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from middlebox.clients.node import DRIVERS, HERE
from middlebox.clients.places import cache_root, in_checkout

STAMP = HERE / "node_modules" / ".middlebox-installed"
LOCK = HERE / ".npm-install.lock"
# What a driver needs beside it to run: the drivers, the modules they share and what npm reads.
SHARED = ("contract.mjs", "api_requests.mjs", "ai_sdk_stream.mjs")
SOURCES = ("package.json", "package-lock.json", *SHARED, *DRIVERS.values())


def lock_digest(folder: Path = HERE) -> str:
    return hashlib.sha256((folder / "package-lock.json").read_bytes()).hexdigest()


def installed(folder: Path = HERE) -> bool:
    stamp = folder / "node_modules" / ".middlebox-installed"
    return stamp.is_file() and stamp.read_text().strip() == lock_digest(folder)


def sources_digest(folder: Path = HERE) -> str:
    """One digest of every source a driver runs with: a changed file gets a new folder."""
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode() + b"\0" + (folder / name).read_bytes() + b"\0")
    return digest.hexdigest()


def driver_folder(checkout: bool | None = None) -> Path:
    """Where the drivers run and npm installs: this folder in a source checkout, else the
    user's cache (`checkout` overrides the detection, for tests)."""
    if in_checkout() if checkout is None else checkout:
        return HERE
    return cache_root() / "node" / sources_digest()[:16]


def copy_sources(target: Path, source: Path = HERE) -> None:
    """The drivers and npm's files into `target`, each written whole (a temporary file, then
    a rename), so a parallel launcher or an interrupted copy never leaves half a file."""
    target.mkdir(parents=True, exist_ok=True)
    for name in SOURCES:
        data = (source / name).read_bytes()
        path = target / name
        if path.is_file() and path.read_bytes() == data:
            continue
        partial = target / f".{name}.{os.getpid()}.tmp"
        partial.write_bytes(data)
        partial.replace(path)


def ready(npm: str = "npm", checkout: bool | None = None) -> Path:
    """The folder to run the drivers from, its packages installed (`npm ci` at most once)."""
    folder = driver_folder(checkout)
    if folder != HERE:
        copy_sources(folder)
    ensure_installed(folder, npm)
    return folder


def ensure_installed(folder: Path, npm: str = "npm") -> None:
    """`npm ci` unless the stamp matches the lockfile; raises CalledProcessError on failure."""
    if installed(folder):
        return
    with open(folder / LOCK.name, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a parallel launcher installs; we wait for it
        if installed(folder):
            return
        print(
            f"middlebox: installing the Node clients' packages (npm ci, once) in {folder}",
            file=sys.stderr,
            flush=True,
        )
        # npm's own output goes to stderr too: stdout is the client's.
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            stdout=sys.stderr,
            check=True,
        )
        (folder / "node_modules" / ".middlebox-installed").write_text(lock_digest(folder) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in DRIVERS:
        print(f"usage: launch NAME, NAME one of {', '.join(DRIVERS)}", file=sys.stderr)
        return 2
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        print(f"{args[0]}: node and npm are needed (apt-get install nodejs npm)", file=sys.stderr)
        return 1
    try:
        folder = ready(npm)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"{args[0]}: npm ci failed: {error}", file=sys.stderr)
        return 1
    driver = str(folder / DRIVERS[args[0]])
    os.execv(node, [node, driver])
    return 1  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main())
