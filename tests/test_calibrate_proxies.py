"""calibrate/proxies.py's configs for the proxies no preset models (lighttpd, Varnish, Squid,
fingerprinted by `python -m calibrate.fingerprints`): each run's one non-default setting is
in its config and absent from the default's, every run names a proxy the launcher knows, and
an unknown run name is refused. No process is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from calibrate import fingerprints, proxies


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
    assert setup.software in proxies.MORE_PACKAGES
    argv, _ = proxies.command(setup, tmp_path, 8081, 9091)
    assert Path(argv[0]).name == setup.software


def test_varnish_passes_the_probe_s_records_so_a_poll_never_reads_a_cached_one(
    tmp_path: Path,
) -> None:
    vcl = _config(proxies.Setup("varnishd"), tmp_path)
    assert 'req.url ~ "/probe/requests"' in vcl and "return (pass);" in vcl


def test_an_unknown_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        fingerprints.main(["nginx-default", "--no-install"])
    assert exited.value.code == 2
    assert "unknown run nginx-default" in capsys.readouterr().err
