"""A preset's `proxy:` block (scenario/presets.py, faults/presets.py's PRESET_PROXY): the
nginx presets turn on nginx's client timers (keepalive_timeout 75 s, client_header_timeout
and client_body_timeout 60 s, as every nginx runs them by default), the scenario's own
`proxy:` fields win, the other presets and pass-through are left as they were, and the
timers then act on the virtual clock through the composed pipeline."""

from __future__ import annotations

import pytest

from faults._proxy.request_timeouts import RequestTimeouts, request_timeout_answer
from faults.testing import TimedItem, replay
from middlebox.compose import PRESETS, PROXY_STAGES, registry
from middlebox.core.fault import Pipeline
from middlebox.core.stream import DOWN, UP, Chunk, Eof
from middlebox.scenario.convert import ScenarioError
from middlebox.scenario.load import load_scenario_text
from middlebox.scenario.model import ProxyOptions, Scenario
from middlebox.scenario.presets import preset_text
from tests.scenario.fakes import PRESETS as FAKE_PRESETS
from tests.scenario.fakes import REGISTRY as FAKE_REGISTRY

NGINX = ("nginx-default", "nginx-streaming", "nginx-gzip")
GET = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
POST_HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"


def scenario(path: str, proxy: str = "") -> Scenario:
    text = f"name: t\npath:\n{path}" + (f"proxy: {proxy}\n" if proxy else "")
    return load_scenario_text(text, registry(), presets=PRESETS)


@pytest.mark.parametrize("name", NGINX)
def test_each_nginx_preset_turns_on_nginx_s_client_timers(name: str) -> None:
    proxy = scenario(f"  - preset: {name}\n").proxy
    assert (proxy.client_header_timeout, proxy.keepalive_timeout, proxy.client_body_timeout) == (
        60.0,
        75.0,
        60.0,
    )
    assert proxy.read_timeout is None  # proxy_read_timeout stays the preset's idle_reaper


@pytest.mark.parametrize("name", sorted(set(PRESETS) - set(NGINX)))
def test_the_other_presets_leave_the_proxy_options_at_their_defaults(name: str) -> None:
    assert scenario(f"  - preset: {name}\n").proxy == ProxyOptions()


def test_the_scenario_s_own_proxy_fields_win_and_null_turns_a_timer_off() -> None:
    proxy = scenario(
        "  - preset: nginx-default\n", "{keepalive_timeout: 5s, client_body_timeout: null}"
    ).proxy
    assert (proxy.keepalive_timeout, proxy.client_body_timeout) == (5.0, None)
    assert proxy.client_header_timeout == 60.0  # the preset's, not written by the scenario


def test_a_preset_with_set_still_lends_its_proxy_block() -> None:
    proxy = scenario(
        "  - preset: {name: nginx-streaming, set: {idle_reaper: {timeout: 1s}}}\n"
    ).proxy
    assert proxy.keepalive_timeout == 75.0


def test_a_scenario_without_presets_keeps_the_proxy_defaults() -> None:
    assert scenario("  - latency: {delay: 1ms}\n").proxy == ProxyOptions()
    assert scenario("  - latency: {delay: 1ms}\n", "{read_timeout: 3s}").proxy == ProxyOptions(
        read_timeout=3.0
    )


def test_a_scenario_s_bad_proxy_value_is_still_a_located_problem() -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(
            "name: t\npath:\n  - preset: nginx-default\nproxy: {max_connections: 0}\n",
            registry(),
            presets=PRESETS,
            file="s.yaml",
        )
    assert [str(p) for p in caught.value.problems] == [
        "s.yaml:4:8: proxy: max_connections must be at least 1 (or null for no limit)"
    ]


# -- the mapping form, with the scenario room's own fakes ------------------------------------

MAPPED = {
    **FAKE_PRESETS,
    "timed-hop": preset_text("- delay: {delay: 1s}\n", "{keepalive_timeout: 9s}"),
    "later-hop": preset_text("- cut\n", "{keepalive_timeout: 3s, client_body_timeout: 4s}"),
    "nested-hop": "path:\n  - preset: timed-hop\n  - cut\n",
    "bad-hop": preset_text("- cut\n", "{keepalive: 9s}"),
}


def fake(path: str) -> Scenario:
    return load_scenario_text(f"name: t\npath:\n{path}", FAKE_REGISTRY, presets=MAPPED)


def test_a_mapping_preset_expands_its_path_and_lends_its_proxy_fields() -> None:
    loaded = fake("  - preset: timed-hop\n")
    assert [spec.name for spec in loaded.path] == ["delay"]
    assert loaded.proxy.keepalive_timeout == 9.0


def test_a_later_preset_s_field_wins_over_an_earlier_one_s() -> None:
    loaded = fake("  - preset: timed-hop\n  - preset: later-hop\n")
    assert (loaded.proxy.keepalive_timeout, loaded.proxy.client_body_timeout) == (3.0, 4.0)
    assert [spec.name for spec in loaded.path] == ["delay", "cut"]


def test_a_preset_inside_a_preset_lends_its_fields_too() -> None:
    loaded = fake("  - preset: nested-hop\n")
    assert [spec.name for spec in loaded.path] == ["delay", "cut"]
    assert loaded.proxy.keepalive_timeout == 9.0


def test_a_preset_s_bad_proxy_block_is_reported_at_the_line_that_uses_it() -> None:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(
            "name: t\npath:\n  - preset: bad-hop\n", FAKE_REGISTRY, presets=MAPPED, file="s.yaml"
        )
    messages = [str(p) for p in caught.value.problems]
    assert "s.yaml:3:13: preset 'bad-hop' has an invalid proxy: block" in messages
    assert any("unknown field 'keepalive'" in message for message in messages)


def test_preset_text_without_a_proxy_block_is_the_path_itself() -> None:
    assert preset_text("- cut\n") == "- cut\n"


# -- the timers acting, on the virtual clock -------------------------------------------------


def composed(loaded: Scenario) -> Pipeline:
    client_side, upstream_side = PROXY_STAGES.around(loaded.proxy)
    faults = [spec.build() for spec in loaded.path]
    return Pipeline([*client_side, *faults, *upstream_side])


def ends(out: list[TimedItem]) -> list[TimedItem]:
    return [(t, item) for t, item in out if not isinstance(item, Chunk)]


def test_nginx_streaming_closes_an_idle_kept_alive_connection_at_75_s() -> None:
    pipeline = composed(scenario("  - preset: nginx-streaming\n"))
    assert any(isinstance(f, RequestTimeouts) for f in pipeline.faults)
    out = replay(pipeline, [(1.0, Chunk(UP, GET)), (2.0, Chunk(DOWN, OK))], until=500.0)
    assert ends(out) == [(77.0, Eof(DOWN)), (77.0, Eof(UP))]


@pytest.mark.parametrize("name", NGINX)
def test_a_body_that_stalls_for_60_s_gets_nginx_s_408(name: str) -> None:
    pipeline = composed(scenario(f"  - preset: {name}\n"))
    out = replay(pipeline, [(1.0, Chunk(UP, POST_HEAD + b"{}"))], until=500.0)
    answer = b"".join(i.data for _, i in out if isinstance(i, Chunk) and i.direction is DOWN)
    assert answer == request_timeout_answer()
    assert [t for t, _ in ends(out)] == [61.0, 61.0]


def test_pass_through_stays_unframed_with_no_timer_of_its_own() -> None:
    pipeline = composed(scenario("  - preset: passthrough\n"))
    assert not any(isinstance(f, RequestTimeouts) for f in pipeline.faults)
    assert pipeline.framing is None
