"""Child processes that do not outlive the process that started them (Linux; stdlib only).

A SIGKILL leaves a process no chance to stop what it started: its emulator, proxies and
clients would keep running, holding their ports. Linux's parent-death signal
(`prctl(PR_SET_PDEATHSIG)`, prctl(2)) has the kernel send the child a signal when its
parent goes, however it goes; every child here asks for SIGTERM, which each of them
(the emulator, `middlebox proxy`, the clients, vLLM) takes as a stop.

The parent the kernel watches is the thread that forked, not the process: a child forked
from a worker thread (trio's `to_thread`, which `trio.lowlevel.open_process` uses, or a
thread pool) is signalled as soon as that thread ends, which trio's idle threads do after
seconds. So `spawn` forks every child from one daemon thread of this process, started on
first use, that lives as long as the process does; the child asks for the signal between
the fork and its exec (`die_with_parent`, which calls only what was loaded before the
fork), and stops at once if its parent is already gone by then.

`die_with_parent` is also what a forked worker (`middlebox proxy --workers`) calls itself.
Where prctl is missing (not Linux) nothing is asked and children are stopped only by the
parent's own cleanup, as before.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

__all__ = ["PR_SET_PDEATHSIG", "die_with_parent", "spawn"]

PR_SET_PDEATHSIG = 1  # prctl(2) option: the signal this process gets when its parent dies

_T = TypeVar("_T")


def _load_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux's libc
        return None


# Loaded here, before any fork: between fork and exec a child may not load a library
# (another thread of the parent may have held the loader's lock when it forked).
_PRCTL = _load_prctl()


def die_with_parent(parent: int, signum: int = signal.SIGTERM) -> None:
    """Ask for `signum` when this process's parent dies; `parent` is its pid as the parent
    saw it before forking: if this process has another parent already, the parent died
    before the request counted, and this process stops at once."""
    if _PRCTL is None:
        return
    _PRCTL(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


class _Spawner:
    """One daemon thread that runs the forks, for the life of the process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()

    def call(self, job: Callable[[], _T]) -> _T:
        """`job()` run on the spawner thread; its result or its exception."""
        if threading.current_thread() is self._thread:
            return job()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="middlebox-spawner", daemon=True
                )
                self._thread.start()
        done: Future[_T] = Future()
        self._jobs.put((job, done))
        return done.result()

    def _serve(self) -> None:
        while True:
            job, done = self._jobs.get()
            try:
                done.set_result(job())
            except BaseException as error:  # handed to the caller, whatever it is
                done.set_exception(error)

    def forget(self) -> None:
        """In a forked child: the parent's spawner thread was not copied; start anew."""
        self._lock = threading.Lock()
        self._thread = None
        self._jobs = queue.SimpleQueue()


_SPAWNER = _Spawner()
os.register_at_fork(after_in_child=_SPAWNER.forget)


def spawn(argv: Sequence[str], **options: Any) -> subprocess.Popen[bytes]:
    """`subprocess.Popen(argv, **options)`, forked by the spawner thread, whose child gets
    SIGTERM when this process dies (a `preexec_fn` in `options` runs after that)."""
    parent = os.getpid()
    then: Callable[[], object] | None = options.pop("preexec_fn", None)

    def prepare() -> None:
        die_with_parent(parent)
        if then is not None:
            then()

    return _SPAWNER.call(lambda: subprocess.Popen(list(argv), preexec_fn=prepare, **options))


def interruptible() -> None:
    """Ctrl-C (SIGINT) stops this process however it was started. A job that a
    non-interactive shell starts in the background (as some CI runners start jobs, or
    `make vllm &` from a script) inherits SIGINT ignored, and Python keeps it so: a
    documented Ctrl-C would then do nothing."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
