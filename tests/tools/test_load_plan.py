"""`middlebox load` builds one `LoadPlan` and `load_test` runs it in its own trio loop.

Against a port nothing listens on, so each request ends at once in a connect error: the
plan's bounds (one request) and the JSON report are what is checked, not timing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from middlebox.cli.main import main
from middlebox.tools.load import LoadPlan, load_test
from tests.harness import free_port


def test_load_test_runs_the_plan_and_writes_its_report_as_json(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    plan = LoadPlan(f"http://127.0.0.1:{free_port()}", 2, 0.2, max_requests=1)
    report = load_test(plan, json_file=out)
    written = json.loads(out.read_text())
    assert written == report.to_json()
    assert (written["streams"], written["requests"], written["completed"]) == (2, 1, 0)
    assert [key.split(":")[0] for key in written["errors"]] == ["connect"]


def test_a_plan_that_cannot_run_is_refused_before_any_request() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        load_test(LoadPlan("http://127.0.0.1:9", 1, 1.0, ramp=0))


def test_the_load_command_passes_its_options_into_the_plan(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    url = f"http://127.0.0.1:{free_port()}"
    args = ["load", "--url", url, "--streams", "3", "--duration", "0.2"]
    result = CliRunner().invoke(main, [*args, "--max-requests", "2", "--json", str(out)])
    written = json.loads(out.read_text())
    assert result.exit_code == 1  # nothing completed
    assert (written["url"], written["streams"], written["requests"]) == (url, 3, 2)
    assert "errors:" in result.output
