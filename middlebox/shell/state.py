"""Where scenario state lives when more than one process runs a scenario (`SharedStore`s).

The faults' view is `middlebox.core.scenario_state`: one mapping per fault position with an
atomic `increment` and `setdefault`. This module holds the stores behind it:

- `MemoryBackend`: for `--workers N`. The supervisor maps one file-backed shared memory
  block before forking; every worker reads and writes it under a POSIX record lock
  (`fcntl.lockf`), which the kernel releases when a process dies, so a worker killed in the
  middle of an operation cannot wedge the others. The block holds the whole state as one
  JSON document (a few counters per fault position), read and rewritten per operation.
- `RedisBackend`: for several proxy processes, on one host or many (`--state
  redis://HOST:PORT/DB`). A counter is Redis INCRBY and a first value SET NX GET, each one
  atomic command, so "the first three requests" stay three over the whole fleet.

Each call is one synchronous round trip on the proxy's event loop (a lock and a small JSON
document, or one Redis command on a kept-alive connection): faults call it per request or
per connection (match counters, `client_vanish`), and `handoff` per item while it waits
for an outage. Keys are namespaced by a `scope`: the scenario's name and the fault's
position, so proxies running one scenario file share its state and a changed path does not
inherit another fault's counters.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import trio

from middlebox.core.scenario_state import SharedStore

_LENGTH = 8  # bytes of the JSON document's length at the start of the memory block


class Backend(Protocol):
    """Atomic single-key operations on JSON values, keys already namespaced."""

    def get(self, key: str) -> Any | None: ...
    def put(self, key: str, value: Any) -> None: ...
    def put_first(self, key: str, value: Any) -> Any: ...
    def add(self, key: str, by: int) -> int: ...
    def remove(self, key: str) -> None: ...
    def keys(self, prefix: str) -> list[str]: ...


class ScopedStore(SharedStore):
    """One fault position's `shared`: a backend's keys under `scope/`."""

    def __init__(self, backend: Backend, scope: str) -> None:
        super().__init__()
        self.backend = backend
        self.prefix = f"{scope}/"

    def __repr__(self) -> str:
        return f"ScopedStore({self.prefix!r})"

    def __getitem__(self, key: str) -> Any:
        value = self.backend.get(self.prefix + key)
        if value is None:
            raise KeyError(key)
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self.backend.get(self.prefix + key)
        return default if value is None else value

    def __setitem__(self, key: str, value: Any) -> None:
        self.backend.put(self.prefix + key, value)

    def __delitem__(self, key: str) -> None:
        if key not in self:
            raise KeyError(key)
        self.backend.remove(self.prefix + key)

    def __iter__(self) -> Iterator[str]:
        return iter([key[len(self.prefix) :] for key in self.backend.keys(self.prefix)])

    def __len__(self) -> int:
        return len(self.backend.keys(self.prefix))

    def setdefault(self, key: str, default: Any = None) -> Any:
        return self.backend.put_first(self.prefix + key, default)

    def increment(self, key: str, by: int = 1) -> int:
        return self.backend.add(self.prefix + key, by)


class MemoryBackend:
    """JSON state in a shared memory block, for processes forked after it was made."""

    def __init__(self, size: int = 1024 * 1024) -> None:
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the store)
        self._file.truncate(size)
        self._block = mmap.mmap(self._file.fileno(), size)
        self._size = size

    def close(self) -> None:
        self._block.close()
        self._file.close()

    def _load(self) -> dict[str, Any]:
        length = int.from_bytes(self._block[:_LENGTH], "little")
        if length == 0:
            return {}
        state: dict[str, Any] = json.loads(self._block[_LENGTH : _LENGTH + length])
        return state

    def _save(self, state: dict[str, Any]) -> None:
        data = json.dumps(state, separators=(",", ":")).encode()
        if _LENGTH + len(data) > self._size:
            raise OverflowError(f"scenario state is {len(data)} bytes, over {self._size}")
        self._block[_LENGTH : _LENGTH + len(data)] = data
        self._block[:_LENGTH] = len(data).to_bytes(_LENGTH, "little")

    def _change(self, change: Callable[[dict[str, Any]], Any], *, write: bool = True) -> Any:
        # lockf locks belong to the process (not the inherited descriptor), so forked
        # workers exclude each other, and the kernel drops a dead holder's lock.
        fcntl.lockf(self._file.fileno(), fcntl.LOCK_EX)
        try:
            state = self._load()
            result = change(state)
            if write:
                self._save(state)
            return result
        finally:
            fcntl.lockf(self._file.fileno(), fcntl.LOCK_UN)

    def get(self, key: str) -> Any | None:
        return self._change(lambda state: state.get(key), write=False)

    def put(self, key: str, value: Any) -> None:
        self._change(lambda state: state.__setitem__(key, value))

    def put_first(self, key: str, value: Any) -> Any:
        return self._change(lambda state: state.setdefault(key, value))

    def add(self, key: str, by: int) -> int:
        def add(state: dict[str, Any]) -> int:
            state[key] = int(state.get(key, 0)) + by
            return int(state[key])

        return int(self._change(add))

    def remove(self, key: str) -> None:
        self._change(lambda state: state.pop(key, None))

    def keys(self, prefix: str) -> list[str]:
        return list(
            self._change(lambda state: [k for k in state if k.startswith(prefix)], write=False)
        )


class RedisBackend:
    """JSON values in a Redis database (the `redis` package, installed on demand)."""

    def __init__(self, url: str, namespace: str = "middlebox:") -> None:
        try:
            import redis
        except ImportError as error:  # an optional dependency: say how to get it
            raise RuntimeError(
                "--state redis://... needs the redis package: pip install 'middlebox[redis]'"
            ) from error
        self._client = redis.Redis.from_url(url)
        self._namespace = namespace
        self._url = url
        self._errors = redis.RedisError

    def check(self) -> None:
        """Fail at start, not on the first request, when the server is not there."""
        try:
            self._client.ping()
        except self._errors as error:
            raise ConnectionError(f"cannot reach Redis at {self._url}: {error}") from error

    def close(self) -> None:
        self._client.close()

    def get(self, key: str) -> Any | None:
        raw = self._client.get(self._namespace + key)
        return None if raw is None else json.loads(raw)

    def put(self, key: str, value: Any) -> None:
        self._client.set(self._namespace + key, json.dumps(value))

    def put_first(self, key: str, value: Any) -> Any:
        # SET NX GET (Redis 7.0): set when missing and return what was there, one command.
        previous = self._client.set(self._namespace + key, json.dumps(value), nx=True, get=True)
        return value if previous is None else json.loads(cast(bytes, previous))

    def add(self, key: str, by: int) -> int:
        # INCRBY stores integers as strings, which json.loads reads back as the same int.
        return int(self._client.incrby(self._namespace + key, by))

    def remove(self, key: str) -> None:
        self._client.delete(self._namespace + key)

    def keys(self, prefix: str) -> list[str]:
        start = len(self._namespace)
        pattern = _glob_escape(self._namespace + prefix) + "*"
        return [key.decode()[start:] for key in self._client.scan_iter(match=pattern)]


def _glob_escape(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def open_backend(url: str) -> RedisBackend:
    """The backend a `--state` URL names (redis://HOST:PORT/DB, rediss:// for TLS)."""
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ValueError(f"--state takes redis://HOST:PORT/DB, got {url!r}")
    backend = RedisBackend(url)
    backend.check()
    return backend


def scoped(backend: Backend) -> Callable[[str], SharedStore]:
    """The server's `shared_state` factory: scope -> that scope's store."""
    return lambda scope: ScopedStore(backend, scope)


class HostClock(trio.abc.Clock):
    """trio's clock read from CLOCK_MONOTONIC without trio's random per-run offset, so the
    times faults keep in a shared store (a match window's epoch, a handoff outage) mean
    the same in every worker and every proxy on this host."""

    def start_clock(self) -> None:
        pass

    def current_time(self) -> float:
        return time.monotonic()

    def deadline_to_sleep_time(self, deadline: float) -> float:
        return deadline - time.monotonic()
