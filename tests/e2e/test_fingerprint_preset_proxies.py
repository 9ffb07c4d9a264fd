"""`middlebox fingerprint --write --verify` through each preset's real proxy that the nginx
tests (test_fingerprint_through_nginx.py) do not cover: HAProxy, Apache and Caddy, each
started as `make calibrate` starts it
(`calibrate.suite.REAL`: Debian's package, its defaults, only the listen address and the
upstream set) in front of a real probe upstream. For each, the fitted scenario played back
through `middlebox proxy` must agree with the real proxy on every measure, at least as many
as the preset played back the same way, and the preset must be named as the closest.
Caddy streams as a path with nothing on it does, so it is named together with `passthrough`
(the empty path), never with another proxy's preset. Skipped where the proxy is not
installed, never under CI=true (.ci/run installs them). Bounded by the budget: each run
plays the grid three times (the proxy, the fitted scenario, the preset)."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate.fingerprints import preset_scenario
from calibrate.proxies import binary, running
from calibrate.suite import REAL
from middlebox.tools.fingerprint import fingerprint, verify_scenario, write_scenario
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.harness import needs

BUDGET = 16.0
# The presets a real proxy names besides its own: a path that holds nothing, times
# nothing out and keeps the upstream leg HTTP/1.1 is the empty path.
ALSO_NAMED = {"caddy-default": {"passthrough"}}
PRESETS = ["haproxy-default", "apache-default", "caddy-default"]


@pytest.mark.parametrize(
    "preset",
    [
        pytest.param(name, marks=needs(binary(REAL[name].software), REAL[name].software))
        for name in PRESETS
    ],
)
def test_the_fitted_scenario_agrees_at_least_as_well_as_the_preset_it_is_named_after(
    tmp_path: Path, preset: str
) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        running(REAL[preset], probe.port, tmp_path / "proxy") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=BUDGET)
    said = "\n".join(found["summary"])
    closest = found["closest_preset"]
    assert set(closest["names"]) == {preset} | ALSO_NAMED.get(preset, set()), said
    assert closest["agrees"] is True, said
    write_scenario(found, tmp_path / "path.yaml")
    mine = verify_scenario(found, tmp_path / "path.yaml", budget=BUDGET)
    scenario = tmp_path / "preset.yaml"
    scenario.write_text(preset_scenario(preset))
    theirs = verify_scenario(dict(found), scenario, budget=BUDGET)
    table = "\n".join(f"{row.measure}: {row.path} / {row.model} {row.ok}" for row in mine)
    assert [row.measure for row in mine if not row.ok] == [], table
    assert sum(row.ok for row in mine) >= sum(row.ok for row in theirs), table
