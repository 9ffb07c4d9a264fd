"""`middlebox proxy --journal-max-bytes` and `--redact-name`: the on-disk journal's
cap and the extra secret names reach `ProxySettings` as the serve function reads them."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from click.testing import CliRunner

from middlebox.cli import proxy as proxy_cli
from middlebox.cli.main import main
from middlebox.observe.journal import MAX_JOURNAL_BYTES
from middlebox.run import serve as serve_module
from middlebox.run.serve import ProxySettings


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> list[ProxySettings]:
    """The settings each `middlebox proxy` run would serve (nothing is served)."""
    seen: list[ProxySettings] = []

    def fake_serve(
        settings: ProxySettings, say: Callable[[str], None], drill: object = None
    ) -> str:
        seen.append(settings)
        return "stopped"

    monkeypatch.setattr(serve_module, "serve", fake_serve)
    monkeypatch.setattr(proxy_cli, "upstream_problem", lambda upstream: None)
    return seen


def run_proxy(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["proxy", "--upstream", "http://127.0.0.1:9", *args])
    return result.exit_code, result.output


def test_the_journal_cap_is_a_size_with_units(served: list[ProxySettings]) -> None:
    code, output = run_proxy("--journal", "j.ndjson", "--journal-max-bytes", "512MiB")
    assert code == 0, output
    assert served[-1].journal_max_bytes == 512 * 1024 * 1024


def test_the_default_cap_is_the_journal_s_own(served: list[ProxySettings]) -> None:
    code, output = run_proxy()
    assert code == 0, output
    assert served[-1].journal_max_bytes == MAX_JOURNAL_BYTES


def test_a_cap_that_is_not_a_size_is_a_usage_error_naming_the_option(
    served: list[ProxySettings],
) -> None:
    code, output = run_proxy("--journal-max-bytes", "lots")
    assert code == 2 and "--journal-max-bytes" in output and "KiB" in output
    assert not served


def test_redact_names_add_to_the_built_in_rule_everywhere_the_settings_redact(
    served: list[ProxySettings],
) -> None:
    code, output = run_proxy("--redact-name", "X-Tenant", "--redact-name", "session_ref")
    assert code == 0, output
    settings = served[-1]
    assert settings.redact_names == ("X-Tenant", "session_ref")
    redaction = settings.redaction
    assert redaction.is_secret("x-tenant") and redaction.is_secret("SESSION_REF")
    assert redaction.is_secret("Authorization")  # the built-in rule still holds
    assert not redaction.is_secret("X-Request-Id")


def test_both_options_are_in_the_help() -> None:
    result = CliRunner().invoke(main, ["proxy", "--help"])
    assert "--journal-max-bytes" in result.output and "--redact-name" in result.output
