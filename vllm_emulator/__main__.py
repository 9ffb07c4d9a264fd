"""`python -m vllm_emulator [--host --port --config FILE --profile ...]`."""

from __future__ import annotations

from vllm_emulator.cli import emulate

if __name__ == "__main__":
    emulate(prog_name="python -m vllm_emulator")
