"""`middlebox fingerprint` against the real vLLM, no probe upstream: directly and through
`middlebox proxy` with nginx's default buffering (`--direct` the vLLM itself). The path's
bursts must be its 4 KiB buffer and the direct ones a token or two; vLLM must be found to
stop generating for a client that leaves, both ways, from its own /metrics
(`vllm:num_requests_running`). The summary is kept in reports/real-vllm/fingerprint-llm.txt.
Bounded by the fingerprint's budget; the proxy is stopped by its PID."""

from __future__ import annotations

from pathlib import Path

from middlebox.tools import fingerprint_llm
from realvllm.serve import SERVED_NAME, Server
from tests.proxy_process import middlebox_proxy
from tests.real_vllm.conftest import RESULTS

BUDGET = 120.0  # two sides; a CPU vLLM under load streams 64 tokens in well under 30 s


def test_the_fingerprint_of_vllm_through_nginx_default_buffering(
    vllm_server: Server, tmp_path: Path
) -> None:
    direct = f"{vllm_server.url}/v1"
    assert fingerprint_llm.served_model(direct, None) == SERVED_NAME
    port = int(vllm_server.url.rsplit(":", 1)[1])
    with middlebox_proxy(tmp_path, port, "  - preset: nginx-default\n", "nginx") as front:
        found = fingerprint_llm.fingerprint(
            f"http://127.0.0.1:{front}/v1", model=SERVED_NAME, direct=direct, budget=BUDGET
        )
    said = "\n".join(found["summary"])
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "fingerprint-llm.txt").write_text(said + "\n")
    assert found["metrics"] == f"{vllm_server.url}/metrics"
    through = found["measures"]["stream"]
    alone = found["direct"]["measures"]["stream"]
    # the tiny random model's byte tokens often decode to no text (an empty delta, not a
    # token event): a 4 KiB burst holds fewer token events than the emulator's ~14
    assert through["burst_events"]["value"] >= 4, said
    assert 3000 <= through["burst_bytes"]["value"] <= 4096, said
    assert alone["burst_events"]["value"] <= 2, said
    assert found["path_adds"]["held"] is True, said
    assert found["summary"][1].startswith("This path holds ~"), said
    for part in (found["measures"], found["direct"]["measures"]):
        cancel = part["cancel"]
        assert cancel["seen_running"] is True and cancel["stopped"] is True, said
        assert cancel["after"] <= 5.0, said
    assert "A client that leaves through the path is noticed by the server" in said
    assert "Not measured: the hold's size" in said
