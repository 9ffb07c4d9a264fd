"""`ControlClient.set_scenario` and `using` take a library scenario by name, as
`load_scenario` and the pytest fixture do; a name that is no file and no library scenario
is `UnknownScenario` with the closest names, before anything is sent. The API is reached
through `ControlApi.route` (no sockets)."""

from __future__ import annotations

from pathlib import Path

import pytest

from middlebox.library import UnknownScenario, scenario_dir
from middlebox.run.live import ControlClient, load_scenario, scenario_text
from tests.run.test_live import api_for_test, route_transport

# the library scenario's upstream: and workload: blocks, which a live proxy leaves alone
LIVE_BLOCKS = ("upstream", "workload")


def test_a_library_scenario_name_is_set_as_its_file_would_be() -> None:
    control = ControlClient(transport=route_transport(api_for_test()))
    applied = control.set_scenario("reset-mid-stream", ignore=LIVE_BLOCKS)
    assert applied["name"] == "reset-mid-stream"
    assert applied["path"] == control.active_scenario()["path"]
    assert [f["fault"] for f in control.faults()] == [
        spec.name for spec in load_scenario("reset-mid-stream").path
    ]


def test_a_name_with_its_suffix_and_a_scenario_in_a_block_by_name_work_too() -> None:
    control = ControlClient(transport=route_transport(api_for_test()))
    assert scenario_text("reset-mid-stream.yaml") == scenario_text("reset-mid-stream")
    with control.using("reset-mid-stream", ignore=LIVE_BLOCKS) as now:
        assert now["name"] == "reset-mid-stream"
    assert control.active_scenario()["name"] == "pass-through"


def test_an_unknown_name_is_unknown_scenario_with_did_you_mean_and_nothing_is_sent() -> None:
    sent: list[str] = []

    def recording(method: str, path: str, body: bytes) -> tuple[int, bytes]:
        sent.append(path)
        return 200, b"{}"

    with pytest.raises(UnknownScenario, match=r"did you mean reset-mid-stream"):
        ControlClient(transport=recording).set_scenario("reset-mid-strem")
    assert sent == []


def test_a_file_that_exists_is_read_as_given_even_where_a_library_name_matches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    own = "name: mine\npath: []\n"
    (tmp_path / "reset-mid-stream").write_text(own)
    assert scenario_text("reset-mid-stream") == own
    library = (scenario_dir() / "reset-mid-stream.yaml").read_text()
    assert scenario_text(scenario_dir() / "reset-mid-stream.yaml") == library
