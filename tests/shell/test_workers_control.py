"""`--control` with `--workers`: each worker's counters on a shared board, summed once.

Pure pieces on their own (the sum of expositions, the board, the supervisor's answer on a
socketpair); tests/shell/test_shared_state_e2e.py runs the real processes.
"""

from __future__ import annotations

import socket
import threading

from middlebox.core.fault import FaultReport
from middlebox.core.stream import Direction
from middlebox.observe.metrics import Metrics, sum_expositions
from middlebox.observe.prometheus import parse_text
from middlebox.scenario.model import Scenario
from middlebox.shell.server import Address, ProxyConfig
from middlebox.shell.workers import MetricsBoard, WorkersControl, worker_server

WORKER_0 = """\
# HELP middlebox_connections_total Client connections accepted.
# TYPE middlebox_connections_total counter
middlebox_connections_total 7
# HELP middlebox_bytes_total Bytes relayed.
# TYPE middlebox_bytes_total counter
middlebox_bytes_total{leg="client",direction="upstream",op="read"} 100
# TYPE middlebox_scenario_info gauge
middlebox_scenario_info{name="s",faults="1"} 1
"""
WORKER_1 = """\
# HELP middlebox_connections_total Client connections accepted.
# TYPE middlebox_connections_total counter
middlebox_connections_total 5
# HELP middlebox_bytes_total Bytes relayed.
# TYPE middlebox_bytes_total counter
middlebox_bytes_total{leg="client",direction="upstream",op="read"} 20.5
middlebox_bytes_total{leg="upstream",direction="downstream",op="wrote"} 3
# TYPE middlebox_scenario_info gauge
middlebox_scenario_info{name="s",faults="1"} 1
"""


def test_the_sum_adds_each_series_over_workers_and_keeps_comments_once() -> None:
    text = sum_expositions([WORKER_0, WORKER_1])
    assert parse_text(text) == {
        "middlebox_connections_total": 12,
        'middlebox_bytes_total{leg="client",direction="upstream",op="read"}': 120.5,
        'middlebox_bytes_total{leg="upstream",direction="downstream",op="wrote"}': 3,
        # the same in every worker: not multiplied by the number of workers
        'middlebox_scenario_info{name="s",faults="1"}': 1,
    }
    assert text.count("# TYPE middlebox_connections_total counter") == 1
    assert text.index("# TYPE middlebox_bytes_total") < text.index("middlebox_bytes_total{")


def test_the_sum_of_nothing_published_yet_is_empty_and_skips_bad_lines() -> None:
    assert sum_expositions(["", ""]) == "\n"
    assert parse_text(sum_expositions(["broken line here", "ok 1"])) == {"ok": 1}


def test_a_board_slot_holds_each_workers_latest_text() -> None:
    board = MetricsBoard(2)
    assert board.texts() == ["", ""]
    board.publish(1, WORKER_1)
    board.publish(0, "old 1\n")
    board.publish(0, WORKER_0)
    assert board.texts() == [WORKER_0, WORKER_1]
    assert parse_text(board.render())["middlebox_connections_total"] == 12


def _ask(control: WorkersControl, request: bytes) -> bytes:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        served = threading.Thread(target=control.answer, args=(theirs,))
        served.start()
        ours.sendall(request)
        served.join(10)
        theirs.shutdown(socket.SHUT_WR)
        answer = b""
        while chunk := ours.recv(65536):
            answer += chunk
    return answer


def test_the_supervisor_answers_metrics_summed_and_refuses_the_per_process_routes() -> None:
    board = MetricsBoard(2)
    board.publish(0, WORKER_0)
    board.publish(1, WORKER_1)
    listener = socket.socket()
    control = WorkersControl(listener, board=board)
    try:
        answer = _ask(control, b"GET /metrics?x=1 HTTP/1.1\r\nHost: c\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Content-Type: text/plain; version=0.0.4" in head
        assert parse_text(body.decode())["middlebox_connections_total"] == 12
        refused = _ask(control, b"PUT /scenario HTTP/1.1\r\nHost: c\r\n\r\n")
        assert refused.startswith(b"HTTP/1.1 501 Not Implemented\r\n")
        assert b"need one process" in refused
    finally:
        listener.close()


def test_a_token_is_required_when_one_is_set() -> None:
    board = MetricsBoard(1)
    board.publish(0, WORKER_0)
    listener = socket.socket()
    control = WorkersControl(listener, token="s3cret", board=board)
    try:
        denied = _ask(control, b"GET /metrics HTTP/1.1\r\nHost: c\r\n\r\n")
        assert denied.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
        wrong = _ask(control, b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer nope\r\n\r\n")
        assert wrong.startswith(b"HTTP/1.1 401 ")
        allowed = _ask(control, b"GET /metrics HTTP/1.1\r\nauthorization: Bearer s3cret\r\n\r\n")
        assert allowed.startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        listener.close()


def test_serving_for_a_while_with_no_scraper_returns_without_answering() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    try:
        WorkersControl(listener, board=MetricsBoard(1)).serve_for(0.0)
        client = socket.create_connection(listener.getsockname()[:2], timeout=10)
        with client:
            client.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            WorkersControl(listener, board=MetricsBoard(1)).serve_for(5.0)
            assert client.recv(65536).startswith(b"HTTP/1.1 200 OK\r\n")
    finally:
        listener.close()


def test_a_worker_counts_its_bytes_and_faults_and_publishes_them_each_tick() -> None:
    board = MetricsBoard(2)
    ticks: list[int] = []
    config = ProxyConfig(Address("127.0.0.1", 1), Scenario(name="s"), tick=lambda: ticks.append(1))
    server = worker_server(config, 1, 2, board)
    assert (server.worker_index, server.worker_count) == (1, 2)
    assert ticks == [] and board.texts()[1] == "" and isinstance(server.metrics, Metrics)
    server.connections_accepted = 3  # a replacement worker continues its predecessor's count
    tick = server.config.tick
    assert tick is not None
    tick()
    assert ticks == [1] and parse_text(board.texts()[1])["middlebox_connections_total"] == 3
    factories = (server.config.observer_factory, server.config.report_sink_factory)
    observer_factory, sink_factory = factories
    assert observer_factory is not None and sink_factory is not None
    observer = observer_factory(2, server.scenario)
    assert observer is not None
    observer.read("client", Direction.UPSTREAM, b"hello", 0.0)
    sink = sink_factory(2)
    assert sink is not None
    sink(FaultReport("http_error", 0.0, "answered", {}))
    server.connections_accepted = 4
    tick()
    samples = parse_text(board.texts()[1])
    assert ticks == [1, 1] and samples["middlebox_connections_total"] == 4
    assert samples['middlebox_bytes_total{leg="client",direction="upstream",op="read"}'] == 5
    assert samples['middlebox_faults_fired_total{fault="http_error",action="answered"}'] == 1
    assert board.texts()[0] == ""
    # The config it was given is left as it was: the counting is the worker's own.
    assert config.observer_factory is None and config.report_sink_factory is None


def test_a_worker_without_a_board_serves_its_config_as_given() -> None:
    config = ProxyConfig(Address("127.0.0.1", 1), Scenario(name="s"))
    server = worker_server(config, 0, 3)
    assert server.config is config and server.metrics is None
    assert [server.global_id(k) for k in (1, 2)] == [1, 4]
