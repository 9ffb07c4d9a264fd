"""The pytest fixture's proxy is a control client of itself: a test starts it from a dict or
a scenario built in code, then adds, changes and removes faults while it runs (routes called
in the proxy's own thread: no control port to share under xdist)."""

from __future__ import annotations

from typing import Any

import pytest

from middlebox.run.live import ControlClient, fault, scenario
from middlebox.run.plugin import FixtureProxy
from tests.run.plugin_example import stream

pytestmark = pytest.mark.e2e

QUICK_UPSTREAM = {"itl": "10ms", "prefill_overhead": "10ms"}


def test_a_test_cuts_the_stream_mid_test_and_streams_clean_once_the_fault_is_gone(
    middlebox_proxy: Any,
) -> None:
    proxy = middlebox_proxy({"name": "starts-clean", "upstream": QUICK_UPSTREAM, "path": []})
    assert isinstance(proxy, FixtureProxy) and isinstance(proxy, ControlClient)
    text, done = stream(proxy.base_url, proxy.model, max_tokens=20)
    assert done and text
    with proxy.fault("cut", after="tokens", count=3, end="fin"):
        assert [f["fault"] for f in proxy.faults()] == ["cut"]
        cut_text, cut_done = stream(proxy.base_url, proxy.model, max_tokens=20)
    assert not cut_done and 0 < len(cut_text) < len(text)
    assert proxy.faults() == []
    again, again_done = stream(proxy.base_url, proxy.model, max_tokens=20)
    assert again_done and again
    facts = proxy.score()
    assert facts["connections"] == 3 and facts["faults_fired"] == {"cut": 1}
    assert proxy.fired() == {"cut": 1}
    assert [j["faults_fired"] for j in proxy.journals()] == [[], ["cut"], []]


def test_a_scenario_built_in_code_starts_the_fixture_and_a_change_applies_mid_test(
    middlebox_proxy: Any,
) -> None:
    built = scenario(
        "capped", fault("max_duration", limit="10s", end="fin"), upstream=QUICK_UPSTREAM
    )
    proxy = middlebox_proxy(built)
    text, done = stream(proxy.base_url, proxy.model, max_tokens=30)
    assert done, "a 10 s cap leaves a short stream alone"
    proxy.change_fault("max_duration", limit="100ms")
    short, short_done = stream(proxy.base_url, proxy.model, max_tokens=30)
    assert not short_done and len(short) < len(text)
    assert proxy.faults()[0]["options"] == {"limit": "100ms", "end": "fin"}
    assert proxy.score()["faults_fired"] == {"max_duration": 1}


def test_a_fault_changed_inside_its_block_is_removed_on_exit(middlebox_proxy: Any) -> None:
    proxy = middlebox_proxy({"name": "starts-clean", "upstream": QUICK_UPSTREAM, "path": []})
    with proxy.fault("latency", delay="300ms"):
        proxy.change_fault("latency", delay="1s")
        assert proxy.faults()[0]["options"] == {"delay": "1s"}
    assert proxy.faults() == []
