"""The pytest plugin: the `middlebox_proxy` fixture starts the emulator and a proxy per
test, its `score()` reports what the journal saw, and a test using it passes or fails
as its scenario dictates, also under pytest-xdist (`-n 2`)."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

from tests.run.plugin_example import DATA, stream

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).parent / "plugin_example.py"


def test_the_plugin_is_registered_as_a_pytest11_entry_point() -> None:
    names = {point.name: point.value for point in entry_points(group="pytest11")}
    assert names.get("middlebox") == "middlebox.run.plugin"


def test_the_fixture_proxies_a_cut_stream_and_scores_it_from_the_journal(
    middlebox_proxy: Any,
) -> None:
    proxy = middlebox_proxy(DATA / "plugin_cut.yaml")
    assert proxy.base_url.startswith("http://127.0.0.1:") and proxy.base_url.endswith("/v1")
    text, done = stream(proxy.base_url, proxy.model)
    assert text and not done
    facts = proxy.score()
    assert facts["connections"] == 1
    assert facts["faults_fired"] == {"max_duration": 1}
    assert facts["faults_never_fired"] == []
    (ends,) = facts["end_kinds"]
    assert "client.sent_fin" in ends
    generations = proxy.ledger()
    assert len(generations) == 1 and generations[0]["completion_tokens"] >= 1


def test_tests_using_the_fixture_pass_and_fail_as_their_scenarios_dictate_under_xdist(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        # plugins the example does not use are left out: each xdist worker loads them again
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
         "-p", "no:hypothesispytest", "-p", "no:trio", "-p", "no:anyio",
         "--rootdir", str(tmp_path), "-c", "/dev/null", str(EXAMPLE)],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
    )  # fmt: skip
    summary = done.stdout.strip().splitlines()[-1]
    assert "1 failed, 1 passed" in summary, done.stdout[-3000:] + done.stderr[-2000:]
    assert "without [DONE]" in done.stdout
    assert "bringing up nodes" in done.stdout  # xdist ran it on workers
