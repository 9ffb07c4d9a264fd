"""`middlebox fingerprint` through a real nginx (Debian's, started as `make calibrate` starts
it: its defaults, only the listen address and upstream set) in front of a real probe
upstream. With the default `proxy_buffering on` it must find the 4 KiB buffer
(`proxy_buffers 8 4k`) within its stated tolerance, that nginx honours `X-Accel-Buffering:
no`, the HTTP/1.0 upstream leg (`proxy_http_version 1.0`) re-chunked toward the client and
the `Host` it rewrites, and no read timeout within the budget (its 60 s); with
`proxy_buffering off` and `proxy_read_timeout 1s` no hold and a timeout of ~1 s, after the
head and before it (a 504); with `gzip on`, the stream compressed for a client that asks,
held to its end under buffering (named nginx-gzip) and flushed per frame without it. The scenario
fitted to nginx's defaults, played back through `middlebox proxy` (`--verify`), must agree on
at least as many measures as the preset nginx-default played back the same way, and the
preset must be named as the closest. Skipped where nginx is not installed, never under
CI=true (.ci/run installs it). Bounded by the budget."""

from __future__ import annotations

from pathlib import Path

from calibrate.proxies import Setup, binary, running
from middlebox.tools.fingerprint import fingerprint, verify_scenario, write_scenario
from middlebox.tools.probe_upstream import ProbeUpstream
from tests.harness import needs

pytestmark = needs(binary("nginx"), "nginx")
BUDGET = 16.0


def test_nginx_defaults_hold_4_kib_and_honour_x_accel_buffering(tmp_path: Path) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        running(Setup("nginx"), probe.port, tmp_path / "nginx") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=BUDGET)
    measures = found["measures"]
    held = measures["hold"]["release"]
    assert held["by"] == "size" and abs(held["bytes"] - 4096) <= held["uncertainty"] <= 263
    assert measures["hold"]["x_accel_buffering_honoured"] is True
    framing = measures["framing"]
    assert (framing["upstream_version"], framing["upstream_framing"]) == ("HTTP/1.0", "close")
    assert (framing["client_framing"], framing["rechunked"]) == ("chunked", True)
    changed = {name.lower() for name, _, _ in measures["request_headers"]["changed"]}
    assert "host" in changed
    assert ["Connection", "close"] in measures["request_headers"]["added"]
    # proxy_read_timeout 60s: longer than the silence the budget leaves
    assert measures["idle"]["cut"] is False and measures["idle"]["at_least"] >= 2.0


def test_nginx_with_proxy_buffering_off_holds_nothing_and_its_read_timeout_is_found(
    tmp_path: Path,
) -> None:
    setup = Setup("nginx", buffering=False, read_timeout=1.0)
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        running(setup, probe.port, tmp_path / "nginx") as port,
    ):
        # the budget leaves a wait for the head: proxy_read_timeout times that wait too
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=24)
    assert found["measures"]["hold"]["release"] == {"held": False, "by": "nothing"}
    head = found["measures"]["head_idle"]
    assert head["cut"] is True and 0.65 <= head["timeout"] <= 1.1
    assert head["end"] == "status 504"
    assert found["measures"]["duration_cap"]["cut"] is False
    assert "x_accel_buffering_honoured" not in found["measures"]["hold"]
    idle = found["measures"]["idle"]
    # nginx's lazy timers (NGX_TIMER_LAZY_DELAY, 300 ms) fire up to 300 ms early
    assert idle["cut"] is True and 0.65 <= idle["timeout"] <= 1.1
    assert idle["client_saw"] == "truncated"
    fitted = write_scenario(found, tmp_path / "path.yaml")
    reaper = fitted.config("idle_reaper")
    assert reaper == {"timeout": idle["timeout"], "after_headers": "close"}
    assert fitted.config("proxy_buffering") is None and fitted.config("http10_upstream") == {}


def test_the_scenario_fitted_to_nginx_agrees_at_least_as_well_as_its_preset(
    tmp_path: Path,
) -> None:
    with (
        ProbeUpstream("127.0.0.1", 0) as probe,
        running(Setup("nginx"), probe.port, tmp_path / "nginx") as port,
    ):
        found = fingerprint(f"http://127.0.0.1:{port}/v1", budget=BUDGET)
    said = "\n".join(found["summary"])
    # nginx without `gzip on` leaves the answer to Accept-Encoding: gzip uncompressed
    assert found["closest_preset"]["names"] == ["nginx-default"], said
    assert found["closest_preset"]["agrees"] is True, said
    fitted = write_scenario(found, tmp_path / "path.yaml")
    assert fitted.config("proxy_buffering") is not None and fitted.config("http10_upstream") == {}
    mine = verify_scenario(found, tmp_path / "path.yaml", budget=BUDGET)
    preset = tmp_path / "preset.yaml"
    preset.write_text("name: preset\npath:\n  - preset: nginx-default\n")
    theirs = verify_scenario(dict(found), preset, budget=BUDGET)
    table = "\n".join(f"{row.measure}: {row.path} / {row.model} {row.ok}" for row in mine)
    assert sum(row.ok for row in mine) >= sum(row.ok for row in theirs), table
    assert {row.measure for row in mine if not row.ok} == set(), table


def test_nginx_gzip_holds_the_compressed_stream_unless_buffering_is_off(tmp_path: Path) -> None:
    # ngx_http_gzip_filter_module sync-flushes only data flagged for flush, which
    # proxy_buffering off sets on every upstream read and buffering does not
    found = {}
    for buffering in (True, False):
        setup = Setup("nginx", buffering=buffering, gzip=True)
        with (
            ProbeUpstream("127.0.0.1", 0) as probe,
            running(setup, probe.port, tmp_path / f"nginx-{buffering}") as port,
        ):
            found[buffering] = fingerprint(f"http://127.0.0.1:{port}/v1", budget=BUDGET)
    held, flushed = found[True]["measures"], found[False]["measures"]
    said = "\n".join(found[True]["summary"])
    assert (held["compression"]["asked"], held["compression"]["flush"]) == ("gzip", "held"), said
    assert held["compression"]["release"] == "end" and held["compression"]["unasked"] is None
    assert found[True]["closest_preset"]["names"] == ["nginx-gzip"], said
    assert found[True]["closest_preset"]["agrees"] is True, said
    assert flushed["compression"]["flush"] == "per-frame", "\n".join(found[False]["summary"])
