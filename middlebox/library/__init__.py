"""The shipped library: the scenario files and the training drills, as package data.

Rule: standard library and PyYAML only; imports no other room. The files are data: this room
finds them (importlib.resources, so an installed wheel and a source checkout read the same
files) and names them; loading and running them is the scenario and run rooms' job.

- `scenarios/NAME.yaml`: the scenario library, each file one real incident (README's
  scenario table). A scenario is addressed by its name wherever a scenario file is taken
  (`middlebox run NAME`, `middlebox validate NAME`, the pytest plugin's
  `middlebox_proxy("NAME")`); a file or directory that exists as given wins over a name.
- `drills/NAME.yaml`: the training drills (`middlebox drill ...`, middlebox/run/drills.py).
"""

from __future__ import annotations

import difflib
import re
from importlib import resources
from pathlib import Path

import yaml

SUFFIXES = (".yaml", ".yml")


class UnknownScenario(LookupError):
    """A target that is neither an existing file or directory nor a library scenario."""


def _folder(name: str) -> Path:
    found = resources.files(__name__) / name
    # The loader, cassettes and `--scenario-dir` read files by path, so the package must be
    # installed as files (pip's wheels are; a zipapp is not).
    if not isinstance(found, Path):
        raise RuntimeError(f"middlebox's {name} must be installed as files, not in {found}")
    return found


def scenario_dir() -> Path:
    """The folder of the library's scenario files."""
    return _folder("scenarios")


def drill_dir() -> Path:
    """The folder of the training drills."""
    return _folder("drills")


def scenario_names() -> list[str]:
    """Every library scenario's name (its file's stem), sorted."""
    return sorted(p.stem for p in scenario_dir().iterdir() if p.suffix in SUFFIXES)


def scenario_file(name: str) -> Path | None:
    """The library file of scenario `name` (`NAME` or `NAME.yaml`), or None."""
    stem = name[: -len(Path(name).suffix)] if Path(name).suffix in SUFFIXES else name
    if "/" in stem or stem.startswith("."):
        return None
    for suffix in SUFFIXES:
        path = scenario_dir() / f"{stem}{suffix}"
        if path.is_file():
            return path
    return None


def library_name(path: Path) -> str | None:
    """The name of the library scenario `path` is the file of, or None for any other file."""
    found = scenario_file(path.stem)
    if found is not None and path.exists() and found.samefile(path):
        return path.stem
    return None


def resolve(target: str | Path) -> Path:
    """A scenario target as a path: a file or directory that exists as given, else the
    library scenario of that name; raises UnknownScenario (with the closest names)."""
    path = Path(target)
    if path.exists():
        return path
    found = scenario_file(str(target))
    if found is not None:
        return found
    close = difflib.get_close_matches(path.stem, scenario_names(), n=3)
    raise UnknownScenario(
        f"{target}: no such file or directory, and no library scenario of that name"
        + (f" (did you mean {', '.join(close)}?)" if close else "")
        + "; `middlebox scenarios` lists the library"
    )


def first_sentence(text: str) -> str:
    """The description's first sentence, on one line: what the README's table shows."""
    flat = " ".join(text.split())
    # A sentence ends at '.', '!' or '?' before a space; "e.g. nginx" does not end one,
    # and "2.6's" or "1.5 s" have no space after the dot.
    match = re.search(r"(?<!\be\.g)(?<!\bi\.e)[.!?](?=\s)", flat)
    return flat[: match.end()] if match else flat


def describe(path: Path) -> str:
    """A scenario file's description's first sentence ('' when it has none); reads the
    YAML only (validation is `middlebox validate`'s job)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    description = data.get("description") if isinstance(data, dict) else None
    return first_sentence(str(description)) if description else ""


def catalogue() -> list[tuple[str, str]]:
    """(name, first sentence of its description) for every library scenario."""
    return [(name, describe(scenario_file(name) or Path(name))) for name in scenario_names()]
