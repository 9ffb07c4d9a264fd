"""The `vllm-0.33` profile differs from a real 0.32.0 exactly as docs/emulator.md says.

Keeps the doc's list ("What the vllm-0.33 profile does differently from a real 0.32.0") honest:
every difference seen must be one it names, and every one it names must be seen.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from realvllm.serve import Server
from tests.real_vllm import wirecompare
from tests.real_vllm.cases import CASES, MAX_MODEL_LEN, MODEL
from tests.real_vllm.conftest import Emulator

CHECKED = ["chat-nonstream", "chat-stream", "chat-stream-include-usage", "completions-nonstream",
           "completions-stream", "version"]  # fmt: skip
DOCUMENTED = {
    "kv_transfer_params on token chunks": r"token frames.*\('kv_transfer_params', None\)",
    "weight_versions on finish chunks and choices": r"\('weight_versions', None\)",
    "completions body: routed_experts, ec_transfer_params, metrics":
        r"completions-nonstream: body.*got 'weight_versions', expected 'routed_experts'",
    "/version": r"version: body.*got '0\.33\.0', expected '0\.32\.0'",
    "no vary: Origin (app.py, any profile)": r"header names .*expected \[.*'vary'",
}  # fmt: skip


@pytest.fixture(scope="module")
def emulator_033(
    middlebox_bin: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Emulator]:
    # 10 ms between tokens: slow enough that token frames are not all merged into the finish
    # chunk, which would hide their kv_transfer_params (wirecompare skips absent token frames).
    config = {"profile": "vllm-0.33", "model": MODEL, "max_model_len": MAX_MODEL_LEN,
              "itl": 0.01, "prefill_overhead": 0.005}  # fmt: skip
    emu = Emulator(middlebox_bin, config, tmp_path_factory.mktemp("emulator033"))
    try:
        yield emu
    finally:
        emu.stop()


def test_the_033_profiles_differences_from_0_32_are_the_documented_ones(
    vllm_server: Server, emulator_033: Emulator
) -> None:
    seen: set[str] = set()
    unexplained = []
    for name, method, path, body in CASES:
        if name not in CHECKED:
            continue
        real = wirecompare.fetch(vllm_server.url, method, path, body)
        emulated = wirecompare.fetch(emulator_033.url, method, path, body)
        for diff in wirecompare.compare(real, emulated, name):
            hits = {k for k, pattern in DOCUMENTED.items() if re.search(pattern, diff, re.S)}
            seen |= hits
            if not hits:
                unexplained.append(diff)
    assert unexplained == []
    assert seen == set(DOCUMENTED)
