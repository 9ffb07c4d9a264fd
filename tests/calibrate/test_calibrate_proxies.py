"""calibrate/proxies.py's configs for the runs of `python -m calibrate.fingerprints`: each
preset's real proxy as `make calibrate` starts it, and the proxies no preset models
(lighttpd, Varnish, Squid), each run's one non-default setting in its config and absent from
the default's; every run names a proxy the launcher knows, a preset's run plays the preset
as a scenario the loader expands, the closing table says what differs, and an unknown run
name is refused. No process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate import fingerprints, proxies, suite
from faults.presets import PRESETS
from middlebox import compose


def _config(setup: proxies.Setup, tmp_path: Path) -> str:
    _, render = proxies.CONFIGS[setup.software]
    return render(setup, tmp_path, 8081, 9091)


@pytest.mark.parametrize(
    ("run", "setting"),
    [
        ("lighttpd-streaming", "server.stream-response-body = 2"),
        ("varnish-between-bytes-1s", ".between_bytes_timeout = 1000ms;"),
        ("squid-read-timeout-1s", "read_timeout 1 seconds"),
    ],
)
def test_each_run_changes_one_setting_of_its_default(
    run: str, setting: str, tmp_path: Path
) -> None:
    changed = fingerprints.RUNS[run]
    default = proxies.Setup(changed.software)
    assert setting in _config(changed, tmp_path)
    assert setting.split()[0] not in _config(default, tmp_path)


@pytest.mark.parametrize("run", list(fingerprints.RUNS))
def test_every_run_listens_on_loopback_and_passes_to_the_probe(run: str, tmp_path: Path) -> None:
    setup = fingerprints.RUNS[run]
    text = _config(setup, tmp_path)
    assert "9091" in text and "127.0.0.1" in text
    assert setup.software in {**proxies.PACKAGES, **proxies.MORE_PACKAGES}
    argv, _ = proxies.command(setup, tmp_path, 8081, 9091)
    assert Path(argv[0]).name == setup.software


def test_varnish_passes_the_probe_s_records_so_a_poll_never_reads_a_cached_one(
    tmp_path: Path,
) -> None:
    vcl = _config(proxies.Setup("varnishd"), tmp_path)
    assert 'req.url ~ "/probe/requests"' in vcl and "return (pass);" in vcl


def test_an_unknown_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        fingerprints.main(["nginx-fast", "--no-install"])
    assert exited.value.code == 2
    assert "unknown run nginx-fast" in capsys.readouterr().err


def test_each_preset_runs_against_its_real_proxy_as_make_calibrate_starts_it() -> None:
    assert fingerprints.PRESET_RUNS == suite.REAL
    for name in fingerprints.PRESET_RUNS:
        assert name in PRESETS and fingerprints.RUNS[name] == suite.REAL[name]
        expanded = compose.load_text(fingerprints.preset_scenario(name)).build_faults()
        alone = compose.load_text(f"name: x\npath: {PRESETS[name]}").build_faults()
        assert [type(f) for f in expanded] == [type(f) for f in alone]
    assert "lighttpd-default" not in fingerprints.PRESET_RUNS


def _document(preset_rows: list[dict[str, object]], agrees: bool) -> dict[str, object]:
    rows = [{"measure": "hold_by", "ok": True}, {"measure": "leave_prompt", "ok": agrees}]
    return {
        "verify": {"agreed": 2, "of": 2, "rows": rows[:1] * 2},
        "preset_verify": {"rows": preset_rows},
        "closest_preset": {"names": ["apache-default"], "agrees": agrees, "rows": rows},
    }


def test_the_closing_row_names_what_differs_and_only_that() -> None:
    preset_rows = [{"measure": "response_headers", "ok": False}]
    line = fingerprints.row("apache-default", _document(preset_rows, False), "1 of 2")
    assert line == (
        "| apache-default | 2 of 2 | 1 of 2 (differs: response_headers) | "
        "nearest apache-default (differs: leave_prompt) |"
    )
    line = fingerprints.row("apache-default", _document([], True), "2 of 2")
    assert line == "| apache-default | 2 of 2 | 2 of 2 | apache-default |"
    assert "differs" not in line
