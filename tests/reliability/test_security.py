"""Security: the control API stays on loopback unless a token guards it; reports and
journals land only under the chosen directory whatever a scenario is called; scenario
files never execute code; secrets in request headers are redacted in journals."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from faults import REGISTRY
from middlebox.cli.main import main
from middlebox.compose import scenario_sections
from middlebox.report.layout import safe_name
from middlebox.run.suite import run_suite
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.load import load_scenario_text
from middlebox.shell.control import check_control_access, is_loopback
from middlebox.shell.server import Address

# ------------------------------------------------------------------ control API


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.53"])
def test_the_control_api_needs_no_token_on_loopback(host: str) -> None:
    assert is_loopback(host)
    check_control_access(Address(host, 0), None)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_the_control_api_refuses_any_other_address_without_a_token(host: str) -> None:
    with pytest.raises(ValueError, match="not loopback\\) needs a token"):
        check_control_access(Address(host, 9000), None)
    check_control_access(Address(host, 9000), "s3cret")  # with a token it may


def test_the_proxy_command_refuses_a_public_control_api_without_a_token_before_binding(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MIDDLEBOX_CONTROL_TOKEN", raising=False)
    args = ["proxy", "--listen", "127.0.0.1:0", "--upstream", "http://127.0.0.1:9"]
    result = CliRunner().invoke(main, [*args, "--control", "0.0.0.0:0"])
    assert result.exit_code != 0
    assert "needs a token" in result.output
    # the control API is off unless asked for: a plain proxy has no --control default
    parsed = main.commands["proxy"].make_context("proxy", ["--upstream", "http://127.0.0.1:9"])
    assert parsed.params["control"] is None


# ---------------------------------------------------------- no code execution

PAYLOADS = [
    "!!python/object/apply:os.system ['touch {marker}']",
    "!!python/object/apply:subprocess.call [['touch', '{marker}']]",
    "!!python/object/new:os.system ['touch {marker}']",
    "!!python/name:os.system",
]
PLACES = [
    "name: {payload}\n",
    "name: x\nseed: {payload}\n",
    "name: x\npath:\n  - latency: {{delay: {payload}}}\n",
    "name: x\npath:\n  - latency: {payload}\n",
    "name: x\npath: {payload}\n",
    "name: x\nexpect: {payload}\n",
    "name: x\nupstream: {payload}\n",
    "name: x\nworkload: {{requests: {payload}}}\n",
    "name: x\nproxy: {payload}\n",
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_python_tags_anywhere_in_a_scenario_are_refused_and_never_run(
    tmp_path: Path, payload: str
) -> None:
    marker = tmp_path / "pwned"
    for place in PLACES:
        text = place.format(payload=payload.format(marker=marker))
        with pytest.raises(ScenarioError) as caught:
            load_scenario_text(text, REGISTRY, file="evil.yaml", sections=scenario_sections())
        assert str(caught.value).startswith("evil.yaml:"), text
        assert not marker.exists(), f"code ran for: {text}"


# ----------------------------------------------- file names from scenario names


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("../../etc/x", "etc-x"),
        ("/etc/passwd", "etc-passwd"),
        ("..", "scenario"),
        ("a/../../b", "a-------b"),
        ("nul\x00byte", "nul-byte"),
        ("C:\\Windows\\x", "C--Windows-x"),
        ("x" * 500, "x" * 80),
        ("ok-name_1", "ok-name_1"),
    ],
)
def test_safe_name_keeps_every_scenario_name_inside_its_directory(name: str, expected: str) -> None:
    cleaned = safe_name(name)
    assert cleaned == expected
    assert "/" not in cleaned and "\\" not in cleaned and not cleaned.startswith(".")


def test_a_run_writes_only_under_the_report_directory_and_redacts_secrets(tmp_path: Path) -> None:
    box = tmp_path / "a" / "b"
    box.mkdir(parents=True)
    scenario = box / "evil.yaml"
    scenario.write_text(
        "name: ../../escaped\n"
        "upstream: {itl: 1ms, prefill_overhead: 1ms}\n"
        "workload: {requests: 1, max_tokens: 4, timeout: 20s}\n"
    )
    report = box / "report"
    before = set(tmp_path.rglob("*"))
    suite = run_suite([str(scenario)], client_names=["raw"], report_dir=report)
    assert suite.outcomes[0].scores, suite.outcomes[0].problems
    written = set(tmp_path.rglob("*")) - before
    outside = [p for p in written if report not in p.parents and p != report]
    assert outside == [], outside
    assert not (tmp_path / "escaped").exists() and not (box.parent / "escaped").exists()
    journals = list(report.rglob("*.journal.ndjson"))
    assert journals and all("escaped" in str(p.parent.name) for p in journals)
    text = "".join(p.read_text() for p in journals)
    captured = b"".join(
        base64.b64decode(line["base64"])
        for p in journals
        for line in map(json.loads, p.read_text().splitlines())
        if line.get("type") == "bytes"
    )
    assert b"Authorization: [redacted]" in captured  # the header is kept, its value is not
    assert "sk-middlebox-test" not in text and b"sk-middlebox-test" not in captured
