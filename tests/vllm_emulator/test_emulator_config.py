"""Configuration: YAML keys with units, clear errors, and the CLI's first stdout line."""

from __future__ import annotations

import json
import subprocess
import sys
import typing
import urllib.request
from pathlib import Path

import click
import pytest

from middlebox.scenario.load import load_scenario_text
from vllm_emulator.cli import emulate
from vllm_emulator.config import (
    EmulatorConfig,
    PauseConfig,
    ProfileName,
    config_from_mapping,
    config_to_mapping,
    load_config,
)


def test_defaults_describe_a_small_model_with_vllm_033s_wire_format() -> None:
    config = EmulatorConfig()
    assert config.profile == "vllm-0.33" and config.model == "middlebox/emulated-7b"
    assert 0.1 <= config.prefill_overhead <= 0.3 and 0.02 <= config.itl <= 0.04
    assert config.abort_on_disconnect and not config.resumable
    assert config.sse_keep_alive_interval == 0.0


def test_yaml_accepts_units_and_nested_pauses(tmp_path: Path) -> None:
    path = tmp_path / "emulator.yaml"
    path.write_text(
        "profile: vllm-0.11\nitl: 25ms\nprefill_overhead: 0.2\nresume_buffer_size: 64KiB\n"
        "pauses:\n  - {after_tokens: 5, duration: 2s}\nsse_keep_alive_interval: 1.5min\n"
    )
    config = load_config(path, profile=None)
    assert config.profile == "vllm-0.11" and config.itl == pytest.approx(0.025)
    assert config.resume_buffer_size == 65536 and config.sse_keep_alive_interval == 90.0
    assert config.pauses == [PauseConfig(after_tokens=5, duration=2.0)]
    assert load_config(path, profile="vllm-0.33").profile == "vllm-0.33"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"itl": "fast"}, "config.itl: expected a duration"),
        ({"profile": "vllm-0.9"}, "'vllm-0.9' is not one of"),
        ({"max_num_seqs": 0}, "max_num_seqs must be at least 1"),
        ({"speed": 3}, "unknown key(s) speed"),
        ({"abort_on_disconnect": "no"}, "expected true or false"),
        ({"max_model_len": 10**6}, "cannot hold one max_model_len"),
        ({"reasoning_tokens": -1}, "reasoning_tokens cannot be negative, got -1"),
        ({"tool_calls_per_response": 0}, "tool_calls_per_response must be at least 1, got 0"),
    ],
)
def test_bad_settings_are_refused_with_a_clear_message(
    data: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        config_from_mapping(data)


def test_a_config_written_as_json_reads_back_equal(tmp_path: Path) -> None:
    config = EmulatorConfig(itl=0.02, pauses=[PauseConfig(3, 1.5)], resumable=True)
    path = tmp_path / "upstream.json"
    path.write_text(json.dumps(config_to_mapping(config)))
    assert load_config(path) == config


def test_field_types_are_ones_the_scenario_loader_understands() -> None:
    allowed = {bool, int, float, str, type(None)}

    def ok(tp: object) -> bool:
        origin = typing.get_origin(tp)
        if origin is typing.Annotated:
            base, unit = typing.get_args(tp)[:2]
            return unit in ("seconds", "bytes") and ok(base)
        if origin is typing.Literal:
            return True
        if origin is list:
            return all(ok(a) for a in typing.get_args(tp))
        if origin is not None:  # X | None
            return all(ok(a) for a in typing.get_args(tp))
        return tp in allowed or tp is PauseConfig

    hints = typing.get_type_hints(EmulatorConfig, include_extras=True)
    assert all(ok(tp) for tp in hints.values()), hints


def test_the_click_command_is_named_emulate_for_the_middlebox_group() -> None:
    assert emulate.name == "emulate"
    assert {p.name for p in emulate.params} == {"host", "port", "config_file", "profile"}


def test_python_m_vllm_emulator_prints_its_port_first_and_serves(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("model: tiny\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm_emulator", "--port", "0", "--config", str(config),
         "--profile", "vllm-0.11"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        with urllib.request.urlopen(line.split(" ")[-1] + "/version", timeout=5) as response:
            assert response.read() == b'{"version":"0.11.0"}'
    finally:
        process.terminate()
        process.wait(10)


def test_the_profile_flag_offers_every_profile_the_config_knows() -> None:
    # One list of profiles (config.ProfileName): a new profile is on the command line at once.
    (profile,) = [p for p in emulate.params if p.name == "profile"]
    assert isinstance(profile.type, click.Choice)
    assert tuple(profile.type.choices) == typing.get_args(ProfileName)
    assert "vllm-0.32" in profile.type.choices


def test_a_scenarios_upstream_block_sets_the_agent_options() -> None:
    # The scenario loader validates `upstream:` against EmulatorConfig by its annotations, so
    # the agent options need no scenario-side code (middlebox/scenario/load.py sections).
    text = "name: think\nupstream:\n  reasoning_tokens: 200\n  tool_calls_per_response: 2\n"
    scenario = load_scenario_text(text, {}, sections={"upstream": EmulatorConfig})
    upstream = scenario.sections["upstream"]
    assert (upstream.reasoning_tokens, upstream.tool_calls_per_response) == (200, 2)
    assert config_from_mapping(config_to_mapping(upstream)) == upstream
