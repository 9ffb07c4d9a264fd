"""The one launcher: it reads readiness from the child's own stdout, fails with what the child
said when it never gets ready, and stops the child's whole process group by its handle."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import trio

from middlebox.run.processes import (
    CHILDREN,
    Children,
    EmulatorProcess,
    UpstreamProcess,
    UpstreamStartError,
    emulator_url,
    start_emulator,
    stop_upstream,
)
from middlebox.run.upstream import UpstreamClient
from tests.process_tree import gone


def test_the_emulator_banner_gives_its_base_url_and_other_lines_give_nothing() -> None:
    assert emulator_url("listening on http://127.0.0.1:43210\n") == "http://127.0.0.1:43210"
    assert emulator_url("listening on http://[::1]:8000") == "http://[::1]:8000"
    assert emulator_url("INFO: starting\n") is None
    assert emulator_url("listening on 127.0.0.1:80\n") is None  # not a URL


def script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


def test_readiness_is_read_past_earlier_lines_and_the_rest_goes_to_the_log(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    child = UpstreamProcess(
        script(
            "import sys, time\n"
            "print('warming up', flush=True)\n"
            "print('ready at http://127.0.0.1:1', flush=True)\n"
            "print('after ready', flush=True)\n"
            "time.sleep(30)\n"
        ),
        lambda line: line.split()[-1] if line.startswith("ready at ") else None,
        log=log,
    )
    try:
        assert child.url == "http://127.0.0.1:1"
        deadline = time.monotonic() + 5
        while "after ready" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert child.running()
    finally:
        child.stop()
    assert not child.running()
    assert child.process.returncode is not None


def test_a_child_that_exits_before_it_is_ready_fails_with_what_it_said() -> None:
    with pytest.raises(UpstreamStartError, match="bad config: no such model"):
        UpstreamProcess(script("print('bad config: no such model')"), lambda line: None)


def test_a_child_that_never_gets_ready_is_stopped_after_the_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(UpstreamStartError, match=r"the upstream was not ready within 0\.5s") as err:
        UpstreamProcess(script("import time; time.sleep(60)"), lambda line: None, timeout=0.5)
    assert err.value.status is None and err.value.cause == "(it wrote nothing)"
    assert time.monotonic() - started < 10


def test_stop_ends_the_childs_own_children_too(tmp_path: Path) -> None:
    """The child leads its own process group, so a grandchild (a shell wrapper's server)
    is stopped with it."""
    pid_file = tmp_path / "grandchild.pid"
    child = UpstreamProcess(
        script(
            "import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
            "print('ready http://x', flush=True)\n"
            "time.sleep(60)\n"
        ),
        lambda line: "http://x" if line.startswith("ready") else None,
    )
    grandchild = int(pid_file.read_text())
    child.stop(grace=5)
    deadline = time.monotonic() + 5
    while not gone(grandchild):
        assert time.monotonic() < deadline, "the grandchild outlived stop()"
        time.sleep(0.05)


async def test_killing_a_hung_clients_group_ends_what_it_started(tmp_path: Path) -> None:
    """A client killed at its workload timeout takes its own children (a Chromium) along."""
    pid_file = tmp_path / "grandchild.pid"
    children = Children()
    client = await children.start(
        script(
            "import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(g.pid))\n"
            "time.sleep(60)\n"
        )
    )
    with trio.fail_after(10):
        while not pid_file.exists() or not pid_file.read_text():
            await trio.sleep(0.02)
    grandchild = int(pid_file.read_text())
    assert not gone(grandchild)
    children.kill_group(client)
    with trio.fail_after(10):
        await client.wait()
        while not gone(grandchild):
            await trio.sleep(0.02)
    assert client.returncode == -9


@pytest.mark.e2e
def test_the_emulator_starts_with_its_config_and_answers_as_configured(tmp_path: Path) -> None:
    emulator = EmulatorProcess({"model": "test/launcher-1b", "seed": 4}, tmp_path)
    try:
        assert emulator.url.startswith("http://127.0.0.1:")
        assert (tmp_path / "emulator.yaml").read_text().strip() == (
            "model: test/launcher-1b\nseed: 4"
        )
        assert UpstreamClient(emulator.url).model() == "test/launcher-1b"
        assert UpstreamClient(emulator.url).ledger() == []
    finally:
        emulator.stop()
    assert not emulator.running()


@pytest.mark.e2e
async def test_from_trio_the_emulator_is_supervised_by_the_runs_children(tmp_path: Path) -> None:
    children = Children()
    CHILDREN.set(children)
    emulator = await start_emulator({"seed": 1}, tmp_path)
    assert children.upstreams == {emulator} and children.started == 1
    await stop_upstream(emulator)
    assert children.upstreams == set() and not emulator.running()
    assert children.started == 1  # still counted: the interrupted message says how many ran
    another = await start_emulator({"seed": 2}, tmp_path)
    with trio.fail_after(15):
        await children.stop_all(grace=5)  # what an interrupted run does
    assert not another.running()
