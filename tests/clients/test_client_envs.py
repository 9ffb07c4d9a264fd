"""Client environments (middlebox/clients/envs.py) and the registry that builds them.

A locked client (openai-v1, openai-v2, langchain-openai, litellm) runs in its own venv
built from a committed lock file the first time it is looked up, like `.venv` from
pyproject.toml: a stamp holds the lock's digest. These tests never build a real venv
(that is the CI subset's first step): pip and venv are replaced by a recorder.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from middlebox import clients
from middlebox.clients import (
    BUILTIN_CLIENTS,
    DEFAULT_CLIENTS,
    ClientRegistry,
    available_clients,
    envs,
)


@pytest.fixture
def env_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "clientenvs"
    monkeypatch.setenv("MIDDLEBOX_CLIENT_ENVS", str(root))
    return root


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A lock folder of our own, one lock per locked client."""
    folder = tmp_path / "locks"
    folder.mkdir()
    for name, client in envs.LOCKED_CLIENTS.items():
        (folder / f"{name}.txt").write_text(f"# {name}\n{client.library}==1.2.3\nanyio==4.0\n")
    monkeypatch.setattr(envs, "LOCK_DIR", folder)
    return folder


class FakeTools:
    """Stands in for `python -m venv`, pip and the purelib query: records each command."""

    def __init__(self, site: Path, fail_at: str | None = None) -> None:
        self.site = site
        self.fail_at = fail_at
        self.commands: list[list[str]] = []

    def __call__(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        self.commands.append(argv)
        text = bool(kwargs.get("text"))
        if self.fail_at is not None and self.fail_at in argv:
            out: Any = "ERROR: No matching distribution found for openai==9.9.9\n"
            return subprocess.CompletedProcess(argv, 1, out if text else out.encode())
        if "venv" in argv:
            Path(argv[-1], "bin").mkdir(parents=True, exist_ok=True)
        out = f"{self.site}\n" if "-c" in argv else ""
        return subprocess.CompletedProcess(argv, 0, out if text else out.encode())


# --- lock files -----------------------------------------------------------------------------


def test_every_locked_client_has_a_lock_that_pins_every_package_exactly() -> None:
    for name, client in envs.LOCKED_CLIENTS.items():
        lines = [
            line
            for line in client.lock.read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        unpinned = [line for line in lines if "==" not in line or ";" in line or ">" in line]
        assert unpinned == [], name
        assert client.library in envs.locked_versions(name), name


def test_the_locks_hold_the_majors_the_client_names_promise() -> None:
    assert envs.library_version("openai-v1").startswith("1.")
    assert envs.library_version("openai-v2").startswith("2.")
    assert envs.library_version("langchain-openai").split(".")[0].isdigit()
    assert envs.library_version("litellm").startswith("1.")
    assert envs.library_version("anthropic-messages").startswith("0.")


def test_lock_versions_are_read_with_normalised_names_and_comments_skipped(
    lock_dir: Path,
) -> None:
    (lock_dir / "litellm.txt").write_text(
        "# a header\nTyping_Extensions==4.16.0  # why\n\nlitellm==1.110.2\n"
    )
    assert envs.locked_versions("litellm") == {"typing-extensions": "4.16.0", "litellm": "1.110.2"}
    assert envs.library_version("litellm") == "1.110.2"


# --- where the environments live and how a client starts ------------------------------------


def test_environments_live_under_clientenvs_unless_moved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MIDDLEBOX_CLIENT_ENVS", raising=False)
    assert envs.env_root() == envs.SOURCE_ROOT / ".clientenvs"
    monkeypatch.setenv("MIDDLEBOX_CLIENT_ENVS", "/elsewhere")
    assert envs.env_dir("litellm") == Path("/elsewhere/litellm")


def test_an_installed_middlebox_builds_them_in_the_users_cache_not_in_site_packages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MIDDLEBOX_CLIENT_ENVS", raising=False)
    monkeypatch.setattr(envs, "in_checkout", lambda: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert envs.env_root() == tmp_path / "cache" / "middlebox" / "clientenvs"


def test_a_locked_client_starts_as_its_environments_python_running_its_driver(
    env_root: Path,
) -> None:
    assert envs.argv("openai-v1") == [
        str(env_root / "openai-v1" / "bin" / "python"),
        "-m",
        "middlebox.clients.openai_sdk_line",
        "openai-v1",
    ]
    assert envs.argv("litellm")[2:] == ["middlebox.clients.litellm_completion", "litellm"]


def test_the_gitignore_keeps_the_environments_out_of_the_repository() -> None:
    ignored = (envs.SOURCE_ROOT / ".gitignore").read_text().splitlines()
    assert ".clientenvs/" in ignored


# --- the stamp ------------------------------------------------------------------------------


def test_an_environment_is_current_only_with_the_stamp_of_the_lock_as_it_is(
    env_root: Path, lock_dir: Path
) -> None:
    assert not envs.is_current("litellm")
    target = env_root / "litellm"
    target.mkdir(parents=True)
    (target / envs.STAMP).write_text(envs.lock_digest(lock_dir / "litellm.txt") + "\n")
    assert envs.is_current("litellm")
    (lock_dir / "litellm.txt").write_text("litellm==9.0.0\n")  # the lock moved on
    assert not envs.is_current("litellm")


def test_ensure_builds_once_and_then_finds_the_stamp(
    env_root: Path,
    lock_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tools = FakeTools(env_root / "site")
    (env_root / "site").mkdir(parents=True)
    monkeypatch.setattr(envs.subprocess, "run", tools)
    python = envs.ensure("openai-v2")
    assert python == env_root / "openai-v2" / "bin" / "python"
    first = len(tools.commands)
    assert first == 3  # venv, pip install -r lock, the purelib query
    assert tools.commands[1][-2:] == ["-r", str(lock_dir / "openai-v2.txt")]
    assert "--no-deps" in tools.commands[1]
    assert envs.is_current("openai-v2")
    # the .pth names a folder holding the middlebox package alone: not the source tree,
    # nor the site-packages (another openai among them) an installed middlebox lives in
    linked = Path((env_root / "site" / "middlebox-source.pth").read_text().strip())
    assert linked == env_root / "openai-v2" / "middlebox-source"
    assert [p.name for p in linked.iterdir()] == ["middlebox"]
    assert (linked / "middlebox").resolve() == Path(clients.__file__).resolve().parents[1]
    said = capsys.readouterr().err
    assert "building the openai-v2 client's environment" in said
    assert "openai-v2 client ready" in said
    envs.ensure("openai-v2")
    assert len(tools.commands) == first  # nothing rebuilt
    assert capsys.readouterr().err == ""


def test_a_failed_pip_install_says_what_pip_said_and_leaves_no_stamp(
    env_root: Path, lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envs.subprocess, "run", FakeTools(env_root / "site", fail_at="pip"))
    with pytest.raises(envs.EnvironmentBuildError, match="No matching distribution") as caught:
        envs.ensure("langchain-openai")
    assert "langchain-openai" in str(caught.value)
    assert not envs.is_current("langchain-openai")


def test_a_client_without_a_lock_file_is_refused_before_anything_is_built(
    env_root: Path, lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (lock_dir / "litellm.txt").unlink()
    tools = FakeTools(env_root / "site")
    monkeypatch.setattr(envs.subprocess, "run", tools)
    with pytest.raises(envs.EnvironmentBuildError, match="no lock file"):
        envs.ensure("litellm")
    assert tools.commands == []


def test_a_stale_environment_is_rebuilt_from_scratch(
    env_root: Path, lock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    leftover = env_root / "openai-v1" / "lib" / "old-package"
    leftover.mkdir(parents=True)
    (env_root / "openai-v1" / envs.STAMP).write_text("a digest of an older lock\n")
    (env_root / "site").mkdir(parents=True)
    monkeypatch.setattr(envs.subprocess, "run", FakeTools(env_root / "site"))
    envs.ensure("openai-v1")
    assert not leftover.exists()
    assert envs.is_current("openai-v1")


# --- the registry ---------------------------------------------------------------------------


def test_listing_the_clients_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str) -> Path:
        raise AssertionError(f"built {name} while listing")

    monkeypatch.setattr(envs, "ensure", refuse)
    names = list(BUILTIN_CLIENTS)
    assert set(envs.LOCKED_CLIENTS) <= set(names)
    assert {"aiohttp-lines", "aiohttp-naive"} <= set(names)
    assert len(BUILTIN_CLIENTS) == len(names) == len(set(names))
    assert "litellm" in BUILTIN_CLIENTS.keys() | set()


def test_looking_up_a_locked_client_builds_its_environment_first(
    monkeypatch: pytest.MonkeyPatch, env_root: Path
) -> None:
    built: list[str] = []
    monkeypatch.setattr(envs, "ensure", lambda name: built.append(name) or env_root)
    assert BUILTIN_CLIENTS["langchain-openai"] == envs.argv("langchain-openai")
    assert built == ["langchain-openai"]
    assert BUILTIN_CLIENTS["raw"][1:] == ["-m", "middlebox.clients.raw"]
    assert built == ["langchain-openai"]  # a .venv client needs nothing built


def test_the_registry_takes_other_clients_in_like_a_dict() -> None:
    registry = ClientRegistry({"raw": ["python", "-m", "raw"]})
    registry.update({"node-x": ["node", "x.mjs"]})
    assert registry["node-x"] == ["node", "x.mjs"]
    assert list(registry)[:2] == ["raw", "node-x"]
    assert list(registry)[2:] == list(envs.LOCKED_CLIENTS)
    del registry["node-x"]
    assert "node-x" not in registry
    with pytest.raises(KeyError):
        registry["nobody"]
    registry["litellm"] = ["my", "litellm"]  # an explicit argv wins over the environment
    assert registry["litellm"] == ["my", "litellm"]
    assert list(registry).count("litellm") == 1


def test_make_run_still_scores_only_the_default_clients(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "chromium_path", lambda: None)
    assert available_clients() == ["raw", "openai", "httpx-sse", "resilient"]
    every = available_clients(every=True)
    assert {"aiohttp-naive", "openai-v1", "litellm"} <= set(every)
    assert not any(name.startswith("browser") for name in every)
    assert DEFAULT_CLIENTS[:4] == ("raw", "openai", "httpx-sse", "resilient")


def test_no_driver_module_is_named_after_the_library_it_imports() -> None:
    """Client names follow the libraries (`openai`, `httpx-sse`, `litellm`); the modules
    never shadow them (`import litellm` inside `litellm.py` would import itself)."""
    modules = {"openai", "aiohttp", "litellm", "langchain_openai", "httpx", "httpx_sse"}
    drivers = {client.module.rsplit(".", 1)[1] for client in envs.LOCKED_CLIENTS.values()}
    drivers |= {
        argv[2].rsplit(".", 1)[1]
        for name, argv in clients.BUILTIN_CLIENTS._argvs.items()
        if argv[1:2] == ["-m"]
    }
    assert drivers & modules == set()
    assert {"aiohttp_lines", "aiohttp_naive", "litellm_completion", "langchain_chat"} <= drivers
