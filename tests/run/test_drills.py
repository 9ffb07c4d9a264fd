"""Training drills: every drill loads and its hidden scenario validates; hints are
progressive and bounded; a fix may not remove the network's faults; and a drill's
check fails on the unfixed client and passes on the fixed one (real run, bounded)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from middlebox.compose import load
from middlebox.library import scenario_names
from middlebox.run.drills import (
    DrillError,
    all_drills,
    briefing,
    check,
    get,
    hint,
    in_drill_terms,
    write_scenario,
)

CLIENT = Path(__file__).parent / "clients" / "sse_client.py"


def test_there_are_at_least_six_drills_each_with_symptoms_hints_and_a_check() -> None:
    drills = all_drills()
    assert len(drills) >= 6
    for drill in drills.values():
        assert drill.symptoms and drill.expect, drill.name
        assert len(drill.hints) >= 3, drill.name
        assert "hidden fault" in drill.hints[-1].lower(), drill.name  # the last one reveals
        assert drill.library in scenario_names(), drill.name


def test_every_drills_hidden_scenario_validates_against_the_fault_registry(
    tmp_path: Path,
) -> None:
    for drill in all_drills().values():
        scenario = load(write_scenario(drill, tmp_path))
        assert scenario.path, drill.name
        assert scenario.sections["expect"] == drill.expect


def test_hints_are_numbered_from_one_and_bounded() -> None:
    first = hint("silent-truncation", 1)
    assert first == get("silent-truncation").hints[0]
    with pytest.raises(DrillError, match="hints 1 to"):
        hint("silent-truncation", 0)
    with pytest.raises(DrillError, match="no drill"):
        hint("no-such-drill", 1)


def test_the_briefing_shows_symptoms_but_not_the_hidden_fault() -> None:
    drill = get("silent-truncation")
    text = briefing(drill)
    assert drill.symptoms in text
    assert "max_duration" not in text


def test_a_proxy_config_fix_must_keep_the_networks_faults(tmp_path: Path) -> None:
    drill = get("idle-timeout-prefill")
    fixed = tmp_path / "fixed.yaml"
    fixed.write_text("name: cheat\npath: []\n")
    with pytest.raises(DrillError, match="removed idle_reaper"):
        write_scenario(drill, tmp_path, fixed)
    fixed.write_text(
        "name: fixed\npath:\n  - idle_reaper: {timeout: 500ms}\n"
        "upstream: {sse_keep_alive_interval: 200ms}\n"
    )
    assert load(write_scenario(drill, tmp_path, fixed)).path[0].name == "idle_reaper"


@pytest.mark.e2e
def test_the_check_fails_the_trusting_client_and_passes_the_one_that_checks_done() -> None:
    unfixed = check("silent-truncation", [f"trainee={sys.executable} {CLIENT} trusting"])
    assert not unfixed.passed
    assert any("client.silent_truncations" in reason for reason in unfixed.reasons)
    fixed = check("silent-truncation", [f"trainee={sys.executable} {CLIENT} careful"])
    assert fixed.passed, fixed.reasons
    (outcome,) = fixed.suite.outcomes
    assert outcome.proof["faults"]["max_duration"]["fired"] >= 1  # the fault was there


def test_a_proxy_start_error_names_the_drill_options_for_its_listeners() -> None:
    said = (
        "the proxy exited at start (exit status 1): cannot listen on 127.0.0.1:9001 "
        "(--control): address already in use"
    )
    assert in_drill_terms(said) == said.replace("(--control)", "(--control-port)")
    assert "(--port)" in in_drill_terms("cannot listen on 127.0.0.1:9 (--listen): denied")
    assert "(--ui-port)" in in_drill_terms("cannot listen on 127.0.0.1:9 (--ui): denied")


def test_an_error_naming_no_listener_option_is_left_as_the_proxy_said_it() -> None:
    said = "the proxy was not ready within 30s: --listen-like words (--upstream) stay"
    assert in_drill_terms(said) == said
