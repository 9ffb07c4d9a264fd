"""A throwaway redis-server (Debian's package) on a free loopback port, for the state tests.

Skips when redis-server is not installed, except under CI=true, where .ci/run installs it
and its absence is a failure."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass

import pytest


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int
    directory: tempfile.TemporaryDirectory[str]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.directory.cleanup()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def redis_server_or_skip() -> RedisServer:
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server is missing under CI=true (.ci/run installs it)")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    directory = tempfile.TemporaryDirectory()
    port = _free_port()
    argv = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--dir", directory.name]  # fmt: skip
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    server = RedisServer(process, port, directory)
    # Bounded wait for the port to accept (redis-server is up in a few ms).
    for _ in range(200):
        if process.poll() is not None:
            break
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    pytest.fail(f"redis-server did not listen on 127.0.0.1:{port}")
