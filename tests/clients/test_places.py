"""Where the clients' installed parts go (middlebox/clients/places.py): the source tree in a
checkout, `$XDG_CACHE_HOME/middlebox` for an installed middlebox."""

from __future__ import annotations

from pathlib import Path

import pytest

from middlebox.clients import places


def test_this_tree_is_a_checkout_and_a_site_packages_folder_is_not(tmp_path: Path) -> None:
    assert places.in_checkout()
    assert places.PACKAGE == places.SOURCE_ROOT / "middlebox"
    assert not places.in_checkout(tmp_path)  # site-packages has no pyproject.toml
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    assert places.in_checkout(tmp_path)


def test_the_cache_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert places.cache_root() == tmp_path / "middlebox"


def test_without_xdg_cache_home_or_with_a_relative_one_the_cache_is_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert places.cache_root() == tmp_path / ".cache" / "middlebox"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the spec says: ignore it
    assert places.cache_root() == tmp_path / ".cache" / "middlebox"
