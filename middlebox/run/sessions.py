"""Whether a local server under `--upstream` runs in another scheduling session than the run.

Linux's autogroup (sched(7), `/proc/sys/kernel/sched_autogroup_enabled`, on by default) puts each
session (setsid: a terminal, a `setsid` command) in a scheduling group of its own and shares the
CPUs between groups before tasks. On these 2 CPUs a vLLM streaming in a session of its own
starved another session for seconds at a time, and did nothing of the kind with both in one
session (docs/real-vllm.md has the measurement). A run's proxies are tasks of the run's own
process, so a server started from another terminal disturbs the very timings a scenario
measures (abandon-* tokens wasted, idle gaps). `middlebox run` says so before it starts; the
re-take rule (`middlebox.run.takes`) cannot tell this apart from a busy machine.

Only a loopback server is looked for, and only where /proc shows who listens (root, or the same
user): otherwise nothing is said.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

AUTOGROUP = Path("/proc/sys/kernel/sched_autogroup_enabled")
PROC = Path("/proc")
LOOPBACK = {"127.0.0.1", "localhost", "::1", "[::1]"}
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column (include/net/tcp_states.h)


def autogroup_enabled(path: Path | None = None) -> bool:
    try:
        return (path or AUTOGROUP).read_text().strip() == "1"
    except OSError:
        return False


def listening_inodes(port: int, proc: Path = PROC) -> set[str]:
    """Socket inodes listening on `port` (any address), from /proc/net/tcp and tcp6."""
    inodes: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = (proc / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            if int(fields[1].rsplit(":", 1)[1], 16) == port:  # local_address is ADDR:PORT in hex
                inodes.add(fields[9])
    return inodes


def listening_pids(port: int, proc: Path = PROC) -> set[int]:
    """The processes holding a socket that listens on `port`, where /proc lets us see them."""
    wanted = {f"socket:[{inode}]" for inode in listening_inodes(port, proc)}
    pids: set[int] = set()
    if not wanted:
        return pids
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                if os.readlink(fd) in wanted:
                    pids.add(int(entry.name))
                    break
        except OSError:  # gone, or not ours to read
            continue
    return pids


def other_session_warning(url: str, autogroup: Path | None = None, proc: Path = PROC) -> str | None:
    """A warning when `url` is a loopback server in another autogroup session, else None."""
    parts = urlsplit(url)
    if parts.hostname not in LOOPBACK or not autogroup_enabled(autogroup):
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    ours = os.getsid(0)
    for pid in sorted(listening_pids(port, proc)):
        try:
            theirs = os.getsid(pid)
        except OSError:
            continue
        if theirs != ours:
            return (
                f"the server at {url} (pid {pid}) runs in another session ({theirs}, this run's "
                f"is {ours}) and Linux's autogroup is on: the kernel shares the CPUs between "
                "sessions first, and a busy server there can hold this run's proxies off the CPU "
                "for seconds, which disturbs what the scenarios time. Start the server "
                "from this session (for example `make vllm &` in the same shell) or turn autogroup "
                "off (sysctl kernel.sched_autogroup_enabled=0)."
            )
    return None
