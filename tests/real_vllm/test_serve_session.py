"""The real vLLM starts in the caller's session, in a process group of its own (no server needed).

Why both: its own group lets `stop_process` end vLLM's engine core and worker with it, and the
caller's session keeps it in the caller's autogroup (sched(7)), where a streaming vLLM in a
session of its own starved the run's proxies for seconds (realvllm.serve.spawn's docstring has
the measurement). The stand-in server here forks a child, as vLLM's API server forks its engine.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from realvllm import serve

# Forks a grandchild, prints its pid and then waits on it, as vLLM's API server waits on its engine.
STAND_IN = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
    "print(child.pid, flush=True)\n"
    "child.wait()\n"
)


def _alive(pid: int) -> bool:
    try:  # a zombie is dead too: it waits only for its new parent to reap it
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_server_shares_the_callers_session_and_leads_its_own_group(tmp_path: Path) -> None:
    log = (tmp_path / "server.log").open("wb")
    process = serve.spawn([sys.executable, "-c", STAND_IN], log, dict(os.environ), tmp_path)
    try:
        assert os.getsid(process.pid) == os.getsid(0)
        assert os.getpgid(process.pid) == process.pid != os.getpgid(0)
    finally:
        serve.stop_process(process, grace=10.0)
        log.close()
    assert process.returncode is not None


def test_stopping_the_server_ends_the_child_it_forked(tmp_path: Path) -> None:
    out = tmp_path / "server.log"
    with out.open("wb") as log:
        process = serve.spawn([sys.executable, "-c", STAND_IN], log, dict(os.environ), tmp_path)
        try:
            child = _first_line_pid(out, process)
            assert os.getpgid(child) == process.pid
        finally:
            serve.stop_process(process, grace=10.0)
    # SIGTERM went to the group, so the grandchild got it too (it is not the server's to reap:
    # wait for it by polling its /proc entry, bounded).
    for _ in range(200):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)


def _first_line_pid(out: Path, process: subprocess.Popen[bytes]) -> int:
    for _ in range(400):
        text = out.read_text()
        if text.endswith("\n"):
            return int(text.split()[0])
        assert process.poll() is None, text
        time.sleep(0.05)
    raise AssertionError(f"the stand-in server printed no child pid: {out.read_text()!r}")


class Started(Exception):
    """What `serve.start` was asked for, raised instead of starting a real vLLM."""


def test_make_vllm_serves_with_the_tool_call_parser_only_when_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def start(
        extra_args: list[str] | None = None,
        log_dir: Path | None = None,
        max_model_len: int = serve.MAX_MODEL_LEN,
        responses_store: bool = False,
    ) -> serve.Server:
        raise Started(extra_args, max_model_len, responses_store)

    monkeypatch.setattr(serve, "start", start)
    monkeypatch.delenv(serve.RESPONSES_STORE_ENV, raising=False)
    tools = list(serve.TOOL_CALL_FLAGS)
    for argv, expected in (
        (["--tool-calls"], (tools, 8192, False)),
        ([], (None, 8192, False)),
        (["--max-model-len", "2048"], (None, 2048, False)),  # a small deployment's context
        (["--responses-store"], (None, 8192, True)),  # VLLM_ENABLE_RESPONSES_API_STORE=1
    ):
        try:
            serve.main(argv)
        except Started as started:
            assert started.args == expected
        else:
            raise AssertionError("main() did not start a server")
    assert serve.command(Path("py"), Path("m"), 1, None, 2048)[-2:] == ["--max-model-len", "2048"]
    assert serve.server_env(responses_store=True)[serve.RESPONSES_STORE_ENV] == "1"
    assert serve.RESPONSES_STORE_ENV not in serve.server_env()
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert "-m realvllm.serve --tool-calls" in makefile


def test_make_vllm_in_the_background_still_stops_on_ctrl_c(monkeypatch: pytest.MonkeyPatch) -> None:
    # `make vllm &` from a script: the shell starts the job with SIGINT ignored, and a server
    # that kept it so would run on after the script's `kill -INT`
    seen: list[object] = []

    def start(
        extra_args: list[str] | None = None,
        log_dir: Path | None = None,
        max_model_len: int = serve.MAX_MODEL_LEN,
        responses_store: bool = False,
    ) -> serve.Server:
        seen.append(signal.getsignal(signal.SIGINT))
        raise Started()

    monkeypatch.setattr(serve, "start", start)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(Started):
            serve.main([])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.default_int_handler]
