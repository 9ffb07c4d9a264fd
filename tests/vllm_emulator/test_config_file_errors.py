"""A bad `--config` file or cassette stops `emulate` before it listens, in one usage line
naming the file (and, where YAML or JSON knows it, the line and column): never a
traceback, nor an emulator that starts and then fails every request or replays a
cassette that holds no response."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import vllm_emulator.cli
from vllm_emulator.cassette import load_cassette
from vllm_emulator.cli import emulate
from vllm_emulator.config import EmulatorConfig, load_config
from vllm_emulator.handlers import CASSETTE_KEY, make_app

RECORDED = {
    "status": 200,
    "headers": [["content-type", "text/event-stream; charset=utf-8"]],
    "writes": [[0.0, base64.b64encode(b"data: [DONE]\n\n").decode()]],
}


def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Stand in for the server: what would have been served, without listening."""
    served: list[Any] = []

    def serve(config: Any, host: str, port: int, ready: Callable[[int], None]) -> None:
        served.append(config)

    monkeypatch.setattr(vllm_emulator.cli, "run_emulator", serve)
    return served


def run_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str) -> Result:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "emulator.yaml").write_text(config)
    return CliRunner().invoke(emulate, ["--config", "emulator.yaml"])


def error_line(result: Result) -> str:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    return line


def test_a_yaml_syntax_error_is_a_usage_error_at_its_line_and_column(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = started(monkeypatch)
    result = run_in(tmp_path, monkeypatch, "itl: [5ms\n")
    assert error_line(result) == (
        "Error: emulator.yaml:2:1: YAML syntax error: while parsing a flow sequence "
        "expected ',' or ']', but got '<stream end>'"
    )
    assert served == []


def test_a_bad_indent_names_the_line_yaml_stopped_at(tmp_path: Path) -> None:
    path = tmp_path / "emulator.yaml"
    path.write_text("itl: 5ms\n  seed: 3\n")
    with pytest.raises(ValueError, match=r"^.*emulator\.yaml:2:7: YAML syntax error: "):
        load_config(path)


def test_a_file_with_a_nul_byte_is_not_yaml_text(tmp_path: Path) -> None:
    path = tmp_path / "emulator.yaml"
    path.write_text("seed: 1\n\x00")
    with pytest.raises(ValueError, match=r"emulator\.yaml:2:1: not a YAML text file"):
        load_config(path)


def test_a_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "emulator.yaml"
    path.write_bytes(b"model: \xff\n")
    with pytest.raises(ValueError, match=r"emulator\.yaml: not a YAML text file \(not UTF-8\)"):
        load_config(path)


def test_a_good_config_file_starts_the_emulator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = started(monkeypatch)
    result = run_in(tmp_path, monkeypatch, "itl: 5ms\n")
    assert result.exit_code == 0, result.output
    assert [config.itl for config in served] == [pytest.approx(0.005)]


def test_a_missing_cassette_is_refused_before_the_emulator_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = started(monkeypatch)
    missing = tmp_path / "no-such-tape.json"
    result = run_in(tmp_path, monkeypatch, f"cassette: {missing}\n")
    assert error_line(result) == (
        f"Error: emulator.yaml: cassette: {missing}: cannot read it: no such file or directory"
    )
    assert served == []


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"status": 200}', "missing headers, writes; a cassette is {\"status\": 200"),
        ("[]", "expected a JSON object"),
        ('{"status": 200, "headers": [], "writes": [[0.1, "%%%"]]}',
         "writes[0]: the body is not base64 text: '%%%'"),
        ('{"status": 200, "headers": [], "writes": [[-1, ""]]}',
         "writes[0]: expected [seconds >= 0, base64], got [-1, '']"),
        ('{"status": 200, "headers": [["x"]], "writes": []}',
         "headers[0]: expected [name, value] strings, got ['x']"),
        ('{"status": "200", "headers": [], "writes": []}',
         "status: expected an HTTP status 100-599, got '200'"),
    ],
)  # fmt: skip
def test_a_cassette_without_what_replay_needs_is_refused_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, problem: str
) -> None:
    served = started(monkeypatch)
    (tmp_path / "tape.json").write_text(text)
    result = run_in(tmp_path, monkeypatch, "cassette: tape.json\n")
    line = error_line(result)
    assert line.startswith("Error: emulator.yaml: cassette: tape.json: not a cassette: ")
    assert problem in line
    assert served == []


def test_a_cassette_that_is_not_json_says_where_it_stopped(tmp_path: Path) -> None:
    (tmp_path / "tape.json").write_text('{"status": 200,\n "headers": [\n')
    with pytest.raises(ValueError, match=r"tape\.json:3:1: not JSON: Expecting value$"):
        load_cassette(tmp_path / "tape.json")


def test_a_recorded_cassette_starts_and_is_read_once_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = started(monkeypatch)
    # what `middlebox record` writes: the request and how it ended ride along, unread
    (tmp_path / "tape.json").write_text(
        json.dumps({**RECORDED, "request": {"method": "POST"}, "truncated": "read_rst"})
    )
    result = run_in(tmp_path, monkeypatch, "cassette: tape.json\n")
    assert result.exit_code == 0, result.output
    app = make_app(served[0])
    (tmp_path / "tape.json").unlink()  # replay no longer needs the file
    cassette = app[CASSETTE_KEY]
    assert cassette.status == 200 and cassette.writes == [(0.0, b"data: [DONE]\n\n")]


def test_an_app_without_a_cassette_generates() -> None:
    assert CASSETTE_KEY not in make_app(EmulatorConfig())


def test_make_app_refuses_a_bad_cassette_too(tmp_path: Path) -> None:
    (tmp_path / "tape.json").write_text('{"status": 200}')
    config = EmulatorConfig(cassette=str(tmp_path / "tape.json"))
    with pytest.raises(ValueError, match="not a cassette: missing headers, writes"):
        make_app(config)
