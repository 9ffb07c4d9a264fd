"""`python -m middlebox.clients.node.launch NAME`: install the Node packages once, run a driver.

The first run (or the first after package-lock.json changed) says so on stderr and runs
`npm ci` in this folder, under a file lock so that clients started in parallel install once;
a stamp inside node_modules/ holds the lockfile's hash. Then the process becomes
`node DRIVER.mjs` (exec), so the runner's SIGTERM and exit status are the driver's own.
Exit 2 for an unknown name (a contract violation, as the drivers use), 1 when Node or the
install is missing or fails.
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

STAMP = HERE / "node_modules" / ".middlebox-installed"
LOCK = HERE / ".npm-install.lock"


def lock_digest(folder: Path = HERE) -> str:
    return hashlib.sha256((folder / "package-lock.json").read_bytes()).hexdigest()


def installed(folder: Path = HERE) -> bool:
    stamp = folder / "node_modules" / ".middlebox-installed"
    return stamp.is_file() and stamp.read_text().strip() == lock_digest(folder)


def ensure_installed(folder: Path = HERE, npm: str = "npm") -> None:
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
        ensure_installed(HERE, npm)
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"{args[0]}: npm ci failed: {error}", file=sys.stderr)
        return 1
    driver = str(HERE / DRIVERS[args[0]])
    os.execv(node, [node, driver])
    return 1  # not reached: exec replaced this process


if __name__ == "__main__":
    raise SystemExit(main())
