"""`middlebox proxy`'s settings: options that do not go together are refused before anything
listens, a bad scenario or address is named, and the options map to the proxy's config (the
one builder every running proxy goes through)."""

from __future__ import annotations

from pathlib import Path

import pytest

from middlebox.compose import PROXY_STAGES
from middlebox.observe.journal import JournalStore, JournalWriter
from middlebox.run.serve import (
    LIBRARY_SCENARIOS,
    OptionConflict,
    ProxySettings,
    SettingsError,
    banner,
    loaded,
    proxy_config,
)
from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyServer

UPSTREAM = "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (ProxySettings(upstream=UPSTREAM, control_token="t"), "needs --control or --ui"),
        (ProxySettings(upstream=UPSTREAM, allow_scenario_header=True), "needs --control"),
        (ProxySettings(upstream=UPSTREAM, ui="127.0.0.1:0", workers=2), "cannot show --workers"),
        (
            ProxySettings(
                upstream=UPSTREAM, control="127.0.0.1:0", workers=2, allow_scenario_header=True
            ),
            "drop --workers",
        ),
        (
            ProxySettings(upstream=UPSTREAM, control="127.0.0.1:0", allow_scenario_header=True),
            "needs --scenario-dir",
        ),
    ],
)
def test_options_that_do_not_go_together_are_a_usage_error(
    settings: ProxySettings, message: str
) -> None:
    with pytest.raises(OptionConflict, match=message):
        loaded(settings)


def test_a_non_loopback_control_api_without_a_token_is_refused() -> None:
    with pytest.raises(SettingsError, match="needs a token") as caught:
        loaded(ProxySettings(upstream=UPSTREAM, control="10.1.2.3:9001"))
    assert not isinstance(caught.value, OptionConflict)


def test_a_bad_address_or_scenario_is_named(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="expected HOST:PORT"):
        loaded(ProxySettings(upstream="nope::"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: broken\npath:\n  - latencyy: {}\n")
    with pytest.raises(SettingsError, match="unknown fault 'latencyy'"):
        loaded(ProxySettings(upstream=UPSTREAM, scenario_file=str(broken)))


def test_without_a_scenario_the_proxy_passes_through_and_says_where_it_listens() -> None:
    what = loaded(ProxySettings(listen="127.0.0.1:0", upstream=UPSTREAM))
    assert what.scenario.name == "pass-through" and what.control is None
    assert banner(what, 9123) == (
        "listening on http://127.0.0.1:9123 -> 127.0.0.1:8000 (scenario 'pass-through', 0 faults)"
    )


def test_the_control_apis_loader_reads_files_and_bodies_with_the_fault_library(
    tmp_path: Path,
) -> None:
    assert ".yaml" in LIBRARY_SCENARIOS.suffixes
    path = tmp_path / "slow.yaml"
    path.write_text("name: slow\npath:\n  - latency: {delay: 5ms}\n")
    assert [spec.name for spec in LIBRARY_SCENARIOS.file(path).path] == ["latency"]
    body = LIBRARY_SCENARIOS.text("name: cut\npath:\n  - cut: {after: bytes, count: 9}\n", "<PUT>")
    assert body.name == "cut" and [spec.name for spec in body.path] == ["cut"]


def test_the_command_lines_options_are_the_proxys_config(tmp_path: Path) -> None:
    settings = ProxySettings(
        listen="127.0.0.5:0",
        upstream="https://127.0.0.1:8443",
        max_connections=7,
        tls=True,
        ca_dir=str(tmp_path),
        upstream_insecure=True,
        upstream_ca="ca.pem",
    )
    what = loaded(settings)
    config = settings.proxy_config(what)
    assert config.upstream == Address("127.0.0.1", 8443, tls=True)
    assert config.scenario is what.scenario and config.stages is PROXY_STAGES
    assert config.max_connections == 7 and config.shared_state is None
    assert config.tls is not None and config.tls.ca_dir == str(tmp_path)
    assert "127.0.0.5" in config.tls.hostnames  # the listen host is in the certificate
    assert (config.upstream_insecure, config.upstream_ca) == (True, "ca.pem")
    assert config.observer_factory is None and config.tick is None  # no --journal
    plain = ProxySettings(upstream=UPSTREAM).proxy_config(loaded(ProxySettings(upstream=UPSTREAM)))
    assert (plain.tls, plain.max_connections, plain.upstream_insecure) == (None, None, False)


def test_a_state_url_that_names_no_store_is_a_settings_error() -> None:
    settings = ProxySettings(upstream=UPSTREAM, state="memcached://127.0.0.1:1")
    with pytest.raises(SettingsError, match="--state"):
        settings.proxy_config(loaded(settings))


async def test_an_on_disk_journal_is_told_each_end_and_ticked_and_one_in_memory_is_not(
    tmp_path: Path,
) -> None:
    scenario = Scenario(name="journaled")
    writer = JournalWriter(lambda _cid: tmp_path / "j.ndjson")
    on_disk = proxy_config(Address("127.0.0.1", 1), scenario, journal=writer)
    assert on_disk.connection_ended == writer.connection_ended and on_disk.tick == writer.tick
    store = JournalStore(capture=True)
    in_memory = proxy_config(Address("127.0.0.1", 1), scenario, journal=store)
    assert in_memory.connection_ended is None and in_memory.tick is None
    assert in_memory.observer_factory is not None and in_memory.report_sink_factory is not None
    in_memory.observer_factory(3, scenario)
    assert store.journals[3].scenario == "journaled"
    bare = proxy_config(Address("127.0.0.1", 1), scenario)
    assert bare.observer_factory is None and bare.report_sink_factory is None


def test_the_proxys_own_stages_are_in_unless_a_bare_relay_is_asked_for() -> None:
    scenario = Scenario(name="s")
    staged = ProxyServer(proxy_config(Address("127.0.0.1", 1), scenario))
    bare = ProxyServer(proxy_config(Address("127.0.0.1", 1), scenario, stages=None))
    # nginx's header timeout (60 s by default) and its refusal of what it cannot frame
    names = [fault.name for fault in staged.make_pipeline(scenario, 1).faults]
    assert names == ["client_header_timeout", "fail_closed", "fail_closed_response"]
    assert bare.make_pipeline(scenario, 1).faults == []
