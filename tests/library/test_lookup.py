"""The shipped library found and named (middlebox/library): a scenario by its name wherever a
scenario file is taken, a path that exists winning over a name, an unknown name refused with
the closest names, and `middlebox scenarios` listing each with its description's first
sentence."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from middlebox.cli.main import main
from middlebox.compose import expand_paths
from middlebox.library import (
    UnknownScenario,
    catalogue,
    drill_dir,
    first_sentence,
    resolve,
    scenario_dir,
    scenario_file,
    scenario_names,
)
from middlebox.run.drills import all_drills
from middlebox.run.suite import scenario_files


def test_the_library_is_package_data_inside_middlebox() -> None:
    assert scenario_dir().parent.name == "library"
    assert scenario_dir().parent.parent.name == "middlebox"
    assert "nginx-default-buffering" in scenario_names()
    assert len(scenario_names()) == len(list(scenario_dir().glob("*.yaml")))
    assert set(all_drills()) == {p.stem for p in drill_dir().glob("*.yaml")}


def test_a_name_with_or_without_its_suffix_is_the_library_file() -> None:
    expected = scenario_dir() / "reset-mid-stream.yaml"
    assert scenario_file("reset-mid-stream") == expected
    assert scenario_file("reset-mid-stream.yaml") == expected
    assert resolve("reset-mid-stream") == expected
    assert scenario_file("no-such-scenario") is None
    assert scenario_file("../scenarios/reset-mid-stream") is None  # names, never paths
    assert scenario_file(".hidden") is None


def test_a_path_that_exists_wins_over_a_library_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "reset-mid-stream").mkdir()  # the project's own folder of that name
    assert resolve("reset-mid-stream") == Path("reset-mid-stream")
    assert expand_paths(["reset-mid-stream"]) == []  # its files, here none
    assert expand_paths(["healthy-baseline", "reset-mid-stream.yaml"]) == [
        scenario_dir() / "healthy-baseline.yaml",
        scenario_dir() / "reset-mid-stream.yaml",
    ]


def test_an_unknown_name_is_refused_with_the_closest_library_names() -> None:
    with pytest.raises(UnknownScenario) as refused:
        resolve("reset-mid-streem")
    assert "did you mean reset-mid-stream" in str(refused.value)
    assert "`middlebox scenarios` lists the library" in str(refused.value)
    with pytest.raises(UnknownScenario) as far:
        resolve("zzzz")
    assert "did you mean" not in str(far.value)
    # the loader, not the lookup, says a missing file cannot be read
    assert expand_paths(["missing.yaml"]) == [Path("missing.yaml")]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("One. Two.", "One."),
        ("A hop (e.g. nginx) buffers.\n  Then it flushes.", "A hop (e.g. nginx) buffers."),
        ("Caddy 2.6's proxy waits 1.5 s. Then it ends.", "Caddy 2.6's proxy waits 1.5 s."),
        ("It ends (preset x). vLLM aborts.", "It ends (preset x)."),
        ("No full stop at all", "No full stop at all"),
    ],
)
def test_the_first_sentence_of_a_description(text: str, first: str) -> None:
    assert first_sentence(text) == first


def test_middlebox_scenarios_lists_every_name_with_its_first_sentence() -> None:
    result = CliRunner().invoke(main, ["scenarios"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[0] for line in lines] == scenario_names()
    healthy = next(line for line in lines if line.startswith("healthy-baseline "))
    assert healthy.split(None, 1)[1] == (
        "No fault at all: loopback between client and a vLLM-like server."
    )
    assert dict(catalogue())["healthy-baseline"] in healthy
    assert CliRunner().invoke(main, ["scenarios", "--dir"]).output.strip() == str(scenario_dir())


PROXY = ["proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:1", "--scenario"]


def test_run_validate_and_proxy_take_a_name_and_refuse_an_unknown_one_as_usage_errors() -> None:
    ok = CliRunner().invoke(main, ["validate", "healthy-baseline"])
    assert ok.exit_code == 0, ok.output
    assert f"ok: {scenario_dir() / 'healthy-baseline.yaml'}" in ok.output
    for argv in (
        ["run", "healthy-baseline", "nginx-default-bufering"],
        ["validate", "nginx-default-bufering"],
        [*PROXY, "nginx-default-bufering"],
    ):
        refused = CliRunner().invoke(main, argv)
        assert refused.exit_code == 2, (argv, refused.output)
        assert "did you mean nginx-default-buffering" in refused.output
    folder = CliRunner().invoke(main, [*PROXY, str(scenario_dir())])
    assert folder.exit_code == 2
    assert "a directory; give one scenario file or name" in folder.output


def test_run_without_a_scenario_runs_the_whole_library() -> None:
    assert scenario_files([]) == sorted(scenario_dir().glob("*.yaml"))
    assert scenario_files(["healthy-baseline"]) == [scenario_dir() / "healthy-baseline.yaml"]
