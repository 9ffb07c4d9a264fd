"""`middlebox proxy`'s settings: options that do not go together are refused before anything
listens, and a bad scenario or address is named."""

from __future__ import annotations

from pathlib import Path

import pytest

from middlebox.run.serve import (
    LIBRARY_SCENARIOS,
    OptionConflict,
    ProxySettings,
    SettingsError,
    banner,
    loaded,
)

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
