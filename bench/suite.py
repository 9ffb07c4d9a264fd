"""The benchmark suite: every path measured side by side in one run, on 127.0.0.1 only.

Paths: `direct` (the load client talks to the upstream: the physical limit), middlebox
pass-through with one and two workers, middlebox with three cheap faults, and nginx
with `proxy_buffering off` as the reference proxy; the console (`--ui`) without and with a
page, at CONSOLE_STREAMS in alternating pairs, its page judged by the share of CPU the
console counts for it and by the median pair (`console_pairs`). The upstream and the load
client are the single-threaded epoll C programs in bench/c/ (compiled here into a
temporary directory), so the harness costs a fraction of a core and stays out of the way.

Every load loop is bounded in count and time, every process we start is stopped by its
PID, and listen ports sit below the ephemeral range (net.ipv4.ip_local_port_range starts
at 32768) so thousands of outgoing connections never collide with them. Those ports are
fixed, so one bench runs at a time on a machine: a second one waits on a lock file
(`BENCH_LOCK`) rather than measure another run's processes, or share their cores.
"""

from __future__ import annotations

import fcntl
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.procs import Proc, cpu_ns, process_tree, rss_kib, wait_listening

ROOT = Path(__file__).resolve().parent.parent
BENCH_LOCK = Path(tempfile.gettempdir()) / "middlebox-bench.lock"
C_SOURCES = Path(__file__).resolve().parent / "c"
UPSTREAM_PORT = 7301
PROXY_PORT = 7302
UI_PORT = 7303
# The console's cost is judged at this count, in this many alternating pairs of windows
# (no page, a page, no page, a page...): one pair's ratio moves more with the shared
# machine's load than the 10% it judges.
CONSOLE_STREAMS = 500
CONSOLE_PAIRS = 3
CONSOLE_PATHS = ("middlebox_ui_idle", "middlebox_ui")
# Streams at which latency, CPU and memory are reported, then the saturation ladder.
LATENCY_STREAMS = (1, 100, 500, 1000)
LADDER = (1500, 2000, 2500)
SATURATION_P99_MS = 5.0
# A path stops climbing the ladder after its added p99 passes this, so a collapsed
# proxy does not burn minutes at higher counts.
STOP_CLIMBING_P99_MS = 20.0
# 64 KiB bulk runs per path, the paths in turn (the median is reported).
BULK_ROUNDS = 3
BULK_PATHS = ("direct", "middlebox", "middlebox_2w", "middlebox_faults", "nginx", "nginx_2w")
# Prefer faults that touch every byte but change nothing a client would notice.
CHEAP_FAULTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("latency", {"delay": 0}),
    ("set_header", {}),
    ("idle_reaper", {"timeout": "600s"}),
    ("strip_header", {}),
    ("slicer", {"size": 65536}),
)


@dataclass
class Settings:
    warmup_s: float = 1.0
    measure_s: float = 3.0
    ramp_per_s: float = 2500.0
    bulk_s: float = 2.0
    connect_s: float = 2.0
    big_bytes: int = 1 << 30
    streams: tuple[int, ...] = LATENCY_STREAMS
    ladder: tuple[int, ...] = LADDER
    only_paths: tuple[str, ...] = ()  # empty: every path
    bulk: bool = True


@dataclass
class Path_:
    """One way from the load client to the upstream. `start` returns the port to use
    and the process to measure (None for direct)."""

    name: str
    label: str
    start: Callable[[], tuple[int, Proc | None]]


class Bench:
    def __init__(self, workdir: Path, settings: Settings, log: Callable[[str], None]) -> None:
        self.workdir = workdir
        self.settings = settings
        self.log = log
        self.upstream_bin = workdir / "upstream"
        self.loadc_bin = workdir / "loadc"
        self.nginx = shutil.which("nginx") or (
            "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
        )
        self.scenario = workdir / "three-faults.yaml"
        self.preset_scenario = workdir / "nginx-default.yaml"
        self.faults: list[str] = []
        # processes a path runs beside the proxy (the console's page), stopped with it
        self.beside: list[Proc] = []
        self.feed_stats: dict[str, dict[str, Any]] = {}

    # ----------------------------------------------------------------- setup

    def compile(self) -> None:
        for name in ("upstream", "loadc"):
            subprocess.run(
                [
                    "gcc",
                    "-O2",
                    "-Wall",
                    "-o",
                    str(self.workdir / name),
                    str(C_SOURCES / f"{name}.c"),
                ],
                check=True,
            )

    def write_scenario(self) -> None:
        from faults import REGISTRY

        chosen = [(name, config) for name, config in CHEAP_FAULTS if name in REGISTRY][:3]
        self.faults = [name for name, _ in chosen]
        lines = [
            "name: bench-three-faults",
            "description: three cheap faults on every byte",
            "path:",
        ]
        for name, config in chosen:
            lines.append(f"  - {name}: {json.dumps(config)}")
        self.scenario.write_text("\n".join(lines) + "\n")
        self.preset_scenario.write_text(
            "name: bench-nginx-default\n"
            "description: the nginx-default preset (buffering, hidden header, read timeout)\n"
            "path:\n  - preset: nginx-default\n"
        )

    def middlebox(self, *args: str) -> Callable[[], tuple[int, Proc | None]]:
        def start() -> tuple[int, Proc | None]:
            argv = [
                sys.executable,
                "-c",
                "from middlebox.cli.main import main; main()",
                "proxy",
                "--listen",
                f"127.0.0.1:{PROXY_PORT}",
                "--upstream",
                f"127.0.0.1:{UPSTREAM_PORT}",
                "--grace",
                "0",
                *args,
            ]
            proc = Proc(argv, cwd=ROOT, log=self.workdir / "middlebox.log")
            wait_listening(PROXY_PORT)
            return PROXY_PORT, proc

        return start

    def middlebox_with_page(self) -> Callable[[], tuple[int, Proc | None]]:
        """Pass-through with the console (`--ui`) and a page attached: a feed consumer
        (bench/feed_consumer.py) reading every update and the newest stream's detail."""
        start_proxy = self.middlebox("--ui", f"127.0.0.1:{UI_PORT}")

        def start() -> tuple[int, Proc | None]:
            port, proc = start_proxy()
            wait_listening(UI_PORT)
            out = self.workdir / f"feed-{len(self.feed_stats)}.json"
            self.feed_stats[str(out)] = {}
            consumer = [sys.executable, "-m", "bench.feed_consumer", "127.0.0.1"]
            consumer += [str(UI_PORT), str(out)]
            self.beside.append(Proc(consumer, cwd=ROOT, log=self.workdir / "feed.log"))
            return port, proc

        return start

    def nginx_path(
        self, workers: int, *, keepalive: bool = True
    ) -> Callable[[], tuple[int, Proc | None]]:
        def start() -> tuple[int, Proc | None]:
            assert self.nginx is not None
            conf_dir = self.workdir / f"nginx{workers}{'' if keepalive else '-nokeepalive'}"
            conf_dir.mkdir(exist_ok=True)
            (conf_dir / "logs").mkdir(exist_ok=True)
            user = "user root;\n" if os.geteuid() == 0 else ""
            # Without `keepalive` in the upstream block nginx dials the upstream for every
            # client request and closes it after the response (ngx_http_upstream_keepalive
            # is what keeps a pool), as a middlebox must: like for like on connection setup.
            pool = " keepalive 256;" if keepalive else ""
            conf = f"""{user}worker_processes {workers};
daemon off;
pid {conf_dir}/nginx.pid;
error_log {conf_dir}/error.log warn;
worker_rlimit_nofile 20000;
events {{ worker_connections 12000; }}
http {{
    access_log off;
    client_body_temp_path {conf_dir}/body;
    proxy_temp_path {conf_dir}/proxy;
    fastcgi_temp_path {conf_dir}/fastcgi;
    uwsgi_temp_path {conf_dir}/uwsgi;
    scgi_temp_path {conf_dir}/scgi;
    upstream bench {{ server 127.0.0.1:{UPSTREAM_PORT};{pool} }}
    server {{
        listen 127.0.0.1:{PROXY_PORT} backlog=4096;
        location / {{
            proxy_pass http://bench;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""
            (conf_dir / "nginx.conf").write_text(conf)
            proc = Proc(
                [self.nginx, "-p", str(conf_dir), "-c", str(conf_dir / "nginx.conf")],
                log=self.workdir / "nginx.log",
            )
            wait_listening(PROXY_PORT)
            return PROXY_PORT, proc

        return start

    def paths(self) -> list[Path_]:
        found = [
            Path_("direct", "direct (no proxy)", lambda: (UPSTREAM_PORT, None)),
            Path_("middlebox", "middlebox pass-through, 1 worker", self.middlebox()),
            Path_(
                "middlebox_2w",
                "middlebox pass-through, 2 workers",
                self.middlebox("--workers", "2"),
            ),
            Path_(
                "middlebox_faults",
                f"middlebox, 3 faults ({', '.join(self.faults)}), 1 worker",
                self.middlebox("--scenario", str(self.scenario)),
            ),
            Path_(
                "middlebox_preset",
                "middlebox, nginx-default preset, 1 worker",
                self.middlebox("--scenario", str(self.preset_scenario)),
            ),
            Path_(
                "middlebox_ui_idle",
                "middlebox pass-through --ui, no page, 1 worker",
                self.middlebox("--ui", f"127.0.0.1:{UI_PORT}"),
            ),
            Path_(
                "middlebox_ui",
                "middlebox pass-through --ui, a page attached, 1 worker",
                self.middlebox_with_page(),
            ),
            Path_(
                "middlebox_journal",
                "middlebox pass-through --journal, 1 worker",
                self.middlebox("--journal", str(self.workdir / "passthrough.ndjson")),
            ),
            Path_(
                "middlebox_faults_journal",
                "middlebox, 3 faults, --journal, 1 worker",
                self.middlebox(
                    "--scenario", str(self.scenario), "--journal", str(self.workdir / "f.ndjson")
                ),
            ),
        ]
        if self.nginx:
            found.append(Path_("nginx", "nginx 1 worker, proxy_buffering off", self.nginx_path(1)))
            found.append(
                Path_("nginx_2w", "nginx 2 workers, proxy_buffering off", self.nginx_path(2))
            )
            found.append(
                Path_(
                    "nginx_nokeepalive",
                    "nginx 1 worker, proxy_buffering off, no upstream keepalive",
                    self.nginx_path(1, keepalive=False),
                )
            )
        return found

    @contextmanager
    def running(self, path: Path_) -> Iterator[tuple[int, Proc | None]]:
        port, proc = path.start()
        try:
            yield port, proc
        finally:
            for beside in self.beside:
                beside.stop()
            self.beside.clear()
            if proc is not None:
                proc.stop()
            time.sleep(0.2)

    # ------------------------------------------------------------- measuring

    def loadc(self, *args: object) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(self.loadc_bin), *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )

    def streams(self, path: Path_, n: int, upstream: Proc) -> dict[str, Any]:
        s = self.settings
        measure = s.measure_s if n > 1 else max(s.measure_s, 5.0)
        with self.running(path) as (port, proc):
            pids = proc.tree() if proc else []
            rss_before = rss_kib(pids)
            client = self.loadc("stream", "127.0.0.1", port, n, s.ramp_per_s, s.warmup_s, measure)
            assert client.stdout is not None
            bound = n / s.ramp_per_s + s.warmup_s + measure + 40
            started = time.monotonic()
            cpu0 = harness0 = 0
            rss_open = 0
            page0: float | None = None
            window_start = time.monotonic()
            harness = [client.pid, upstream.pid]
            result: dict[str, Any] = {}
            for line in client.stdout:
                if line.startswith("measure_start"):
                    pids = proc.tree() if proc else []
                    rss_open = rss_kib(pids)
                    page0 = page_cpu_s() if path.name in CONSOLE_PATHS else None
                    cpu0, harness0 = cpu_ns(pids), cpu_ns(harness)
                    window_start = time.monotonic()
                elif line.startswith("{"):
                    elapsed = time.monotonic() - window_start
                    cpu1, harness1 = cpu_ns(pids), cpu_ns(harness)
                    page1 = page_cpu_s() if page0 is not None else None
                    result = json.loads(line)
                    frames = max(result["frames"], 1)
                    result["proxy_cpu_us_per_frame"] = (
                        (cpu1 - cpu0) / 1000 / frames if proc else 0.0
                    )
                    result["proxy_cores"] = (cpu1 - cpu0) / 1e9 / elapsed if proc else 0.0
                    result["harness_cores"] = (harness1 - harness0) / 1e9 / elapsed
                    result["rss_kib_before"] = rss_before
                    result["rss_kib_open"] = rss_open
                    result["rss_kib_per_stream"] = (rss_open - rss_before) / n if proc else 0.0
                    if page0 is not None and page1 is not None:
                        # the console's own count of its pages' CPU in the same window
                        page = page1 - page0
                        result["page_cpu_s"] = page
                        result["page_share"] = page / max((cpu1 - cpu0) / 1e9 - page, 1e-9)
                    for beside in self.beside:  # the page's feed, for its update rate
                        beside.stop()
                if time.monotonic() - started > bound:
                    break
            try:
                client.wait(10)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
        result.update(path=path.name, streams=n, load_average=round(os.getloadavg()[0], 2))
        for out in list(self.feed_stats):
            if Path(out).exists():
                feed = json.loads(Path(out).read_text())
                seconds = max(feed.get("seconds", 0), 1e-9)
                result["feed_updates_per_s"] = round(feed["updates"] / seconds, 2)
                result["feed_kib_per_s"] = round(feed["bytes"] / 1024 / seconds, 1)
                del self.feed_stats[out]
        return result

    def against_direct(
        self, row: dict[str, Any], direct: dict[str, Any], path: Path_, upstream: Proc
    ) -> dict[str, Any]:
        """The row with its latency added to the direct path's; a miss of the saturation
        bound measured once more (not for paired rows: the pairs are the repeats)."""
        added(row, direct)
        if row["added_p99_ms"] >= SATURATION_P99_MS and "pair" not in row:
            # The machine is shared: a miss is measured once more and the
            # better run kept, by the same rule for every path.
            again = self.streams(path, row["streams"], upstream)
            if "p99_ms" in again and again["p99_ms"] < row["p99_ms"]:
                added(again, direct)
                again["repeated"] = True
                return again
        return row

    def console_pairs(
        self, idle: Path_, page: Path_, n: int, upstream: Proc
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The console without and with a page, in CONSOLE_PAIRS alternating pairs of
        windows: each pair's CPU-per-frame ratio, their median, and the page's share of the
        proxy's CPU as the console counts it (docs/ui.md). The rows kept for the stream
        table are the median pair's."""
        pairs = [(self.streams(idle, n, upstream), self.streams(page, n, upstream))]
        while len(pairs) < CONSOLE_PAIRS:
            pairs.append((self.streams(idle, n, upstream), self.streams(page, n, upstream)))
        measured = []
        for without, with_page in pairs:
            ratio = with_page["proxy_cpu_us_per_frame"] / max(
                without["proxy_cpu_us_per_frame"], 1e-9
            )
            measured.append(
                {
                    "ratio": round(ratio, 3),
                    "page_share": round(with_page.get("page_share", float("nan")), 4),
                    "no_page_cpu_s": without.get("page_cpu_s"),
                    "load_average": with_page["load_average"],
                }
            )
            self.log(
                f"console pair {len(measured)}: page/no page {ratio:.3f}x, the page's own "
                f"CPU {measured[-1]['page_share']:.1%} of the proxy's, "
                f"load {with_page['load_average']}"
            )
        ratios = [m["ratio"] for m in measured]
        median = statistics.median(ratios)
        middle = min(range(len(pairs)), key=lambda i: abs(ratios[i] - median))
        rows = list(pairs[middle])
        for row in rows:
            row["pair"] = f"median of {len(pairs)} pairs"
        summary = {
            "streams": n,
            "pairs": measured,
            "median_ratio": round(median, 3),
            "page_share": round(statistics.median(m["page_share"] for m in measured), 4),
        }
        return rows, summary

    def bulk(
        self, path: Path_, connections: int, size: int, seconds: float, limit: int
    ) -> dict[str, Any]:
        with self.running(path) as (port, proc):
            pids = proc.tree() if proc else []
            cpu0 = cpu_ns(pids)
            client = self.loadc("bulk", "127.0.0.1", port, connections, size, seconds, limit)
            out, _ = client.communicate(timeout=seconds + 60)
            cpu1 = cpu_ns(process_tree(proc.pid)) if proc else 0
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result["proxy_cpu_s"] = (cpu1 - cpu0) / 1e9 if proc else 0.0
        result.update(path=path.name)
        return result

    def bulk_rounds(self, paths: list[Path_], seconds: float) -> list[dict[str, Any]]:
        """64 KiB responses on each path, BULK_ROUNDS times with the paths in turn; each
        path's row is its median run (`runs`: every run's MB/s). One 2 s run of a path
        can move by half on this shared machine, so a ratio of two single runs could
        meet or miss by luck."""
        runs: dict[str, list[dict[str, Any]]] = {path.name: [] for path in paths}
        for _ in range(BULK_ROUNDS):
            for path in paths:
                row = self.bulk(path, 8, 65536, seconds, 0)
                runs[path.name].append(row)
                self.log(f"bulk 64KiB  {path.name:18} {row['mb_per_s']:9.1f} MB/s")
        return [median_run(rows) for rows in runs.values()]

    def connect(self, path: Path_, concurrency: int, seconds: float) -> dict[str, Any]:
        with self.running(path) as (port, _proc):
            client = self.loadc("connect", "127.0.0.1", port, concurrency, seconds, 20000)
            out, _ = client.communicate(timeout=seconds + 60)
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        result.update(path=path.name)
        return result

    # --------------------------------------------------------------- the run

    def run(self) -> dict[str, Any]:
        s = self.settings
        started = time.monotonic()
        self.compile()
        self.write_scenario()
        paths = self.paths()
        if s.only_paths:
            paths = [p for p in paths if p.name in s.only_paths]
        # nginx without keepalive streams exactly as nginx does (one long request per
        # connection); it differs only where connections are new, so only there it runs.
        stream_paths = [p for p in paths if p.name not in ("nginx_2w", "nginx_nokeepalive")]
        results: dict[str, Any] = {
            "machine": machine(),
            "versions": versions(self.nginx),
            "settings": s.__dict__ | {"faults": self.faults},
            "paths": {p.name: p.label for p in paths},
            "stream": [],
            "bulk_64k": [],
            "bulk_big": [],
            "connect": [],
        }
        upstream = Proc(
            [str(self.upstream_bin), str(UPSTREAM_PORT), "50"], log=self.workdir / "upstream.log"
        )
        try:
            wait_listening(UPSTREAM_PORT)
            climbing = {p.name for p in stream_paths}
            for n in (*s.streams, *s.ladder):
                in_ladder = n in s.ladder
                todo = [path for path in stream_paths if not in_ladder or path.name in climbing]
                if not any(path.name != "direct" for path in todo):
                    break
                direct: dict[str, Any] | None = None
                names = {path.name: path for path in todo}
                paired = n == CONSOLE_STREAMS and all(name in names for name in CONSOLE_PATHS)
                for path in todo:
                    if paired and path.name == CONSOLE_PATHS[1]:
                        continue  # measured in pairs with the first
                    if paired and path.name == CONSOLE_PATHS[0]:
                        rows, results["console"] = self.console_pairs(
                            path, names[CONSOLE_PATHS[1]], n, upstream
                        )
                    else:
                        rows = [self.streams(path, n, upstream)]
                    for row in rows:
                        if direct is not None and "p99_ms" in row:
                            row = self.against_direct(row, direct, names[row["path"]], upstream)
                            if row["added_p99_ms"] > STOP_CLIMBING_P99_MS:
                                climbing.discard(row["path"])
                        results["stream"].append(row)
                        self.log(stream_line(row))
                    if path.name == "direct":
                        direct = rows[0]
            # The journal would keep every bulk byte and the preset's HTTP/1.0 upstream leg
            # closes after each response: bulk runs on the paths it compares.
            bulk_paths = [p for p in paths if p.name in BULK_PATHS] if s.bulk else []
            results["bulk_64k"] = self.bulk_rounds(bulk_paths, s.bulk_s)
            for path in bulk_paths:
                row = self.bulk(path, 1, s.big_bytes, 30, 1)
                results["bulk_big"].append(row)
                self.log(f"bulk 1 conn {path.name:18} {row['mb_per_s']:9.1f} MB/s")
            for path in paths if s.bulk else []:
                row = self.connect(path, 16, s.connect_s)
                results["connect"].append(row)
                self.log(f"connect     {path.name:18} {row['per_s']:9.1f} /s")
        finally:
            upstream.stop()
        results["saturation"] = saturation(results["stream"])
        results["targets"] = targets(results)
        results["duration_s"] = round(time.monotonic() - started, 1)
        return results


def median_run(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median MB/s (the lower middle one of an even count), with every
    run's MB/s beside it."""
    ordered = sorted(rows, key=lambda row: row["mb_per_s"])
    middle = dict(ordered[(len(ordered) - 1) // 2])
    middle["runs"] = [row["mb_per_s"] for row in rows]
    return middle


def page_cpu_s() -> float | None:
    """The console's own count of the CPU seconds its pages cost (`GET /api/stats`), or
    None when it does not answer."""
    ui = http.client.HTTPConnection("127.0.0.1", UI_PORT, timeout=5)
    try:
        ui.request("GET", "/api/stats")
        return float(json.loads(ui.getresponse().read())["page_cpu_s"])
    except (OSError, ValueError, KeyError, http.client.HTTPException):
        return None
    finally:
        ui.close()


def added(row: dict[str, Any], direct: dict[str, Any]) -> None:
    row["added_p50_ms"] = row["p50_ms"] - direct["p50_ms"]
    row["added_p99_ms"] = row["p99_ms"] - direct["p99_ms"]


def stream_line(row: dict[str, Any]) -> str:
    added = (
        f" added p50 {row['added_p50_ms']:6.3f} p99 {row['added_p99_ms']:7.3f}"
        if "added_p99_ms" in row
        else ""
    )
    return (
        f"streams {row['streams']:5} {row['path']:18} p50 {row.get('p50_ms', -1):6.3f} "
        f"p99 {row.get('p99_ms', -1):7.3f}{added} "
        f"cpu {row.get('proxy_cpu_us_per_frame', 0):5.1f}us/frame "
        f"rss {row.get('rss_kib_per_stream', 0):5.1f}KiB/stream errors "
        f"{row.get('connect_errors', '?')}/{row.get('closed_early', '?')}"
    )


def saturation(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The most streams each path held with added p99 under 5 ms (and every frame on time)."""
    best: dict[str, int] = {}
    for row in sorted(rows, key=lambda r: r["streams"]):
        if "added_p99_ms" not in row:
            continue
        expected = row["streams"] * 20 * row.get("window_s", 0)
        delivered = row.get("frames", 0) >= 0.98 * expected
        if row["added_p99_ms"] < SATURATION_P99_MS and delivered and not row.get("connect_errors"):
            best[row["path"]] = max(best.get(row["path"], 0), row["streams"])
    return best


def _row(rows: list[dict[str, Any]], path: str, **match: Any) -> dict[str, Any] | None:
    for row in rows:
        if row["path"] == path and all(row.get(k) == v for k, v in match.items()):
            return row
    return None


def _ratio_target(
    out: list[dict[str, Any]], target: str, mine: float, theirs: float, limit: float, unit: str
) -> None:
    """A target `mine / theirs <= limit` (or >= for a negative limit: `at least`)."""
    if theirs <= 0:
        return
    ratio = mine / theirs
    met = ratio >= -limit if limit < 0 else ratio <= limit
    out.append(
        {
            "target": target,
            "measured": f"{mine:.1f} vs {theirs:.1f} {unit} = {ratio:.2f}x",
            "met": met,
        }
    )


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The bench's targets (docs/performance.md), each against the baselines of the same run."""
    out: list[dict[str, Any]] = []
    stream = results["stream"]
    held = results["saturation"]
    mb = _row(stream, "middlebox", streams=1000)
    nginx = _row(stream, "nginx", streams=1000)
    for name, what in (
        ("middlebox_faults", "three-fault path"),
        ("middlebox_preset", "nginx-default preset path"),
    ):
        if _row(stream, name) is None:
            continue
        out.append(
            {
                "target": f"{what} holds 2000 streams, one worker (added p99 < 5 ms)",
                "measured": f"{held.get(name, 0)} streams",
                "met": held.get(name, 0) >= 2000,
            }
        )
        # CPU per frame against pass-through at 1000 streams, or the largest count both
        # measured below it: a path that held 1000 climbs the ladder until its worker
        # saturates, and a saturated worker's CPU per frame is one core over the frames
        # delivered (it reads several frames a wake-up), which says nothing of its cost.
        counts = sorted(
            {r["streams"] for r in stream if r["path"] == name and 1 < r["streams"] <= 1000}
            & {r["streams"] for r in stream if r["path"] == "middlebox"}
        )
        if counts:
            faulted = _row(stream, name, streams=counts[-1])
            plain = _row(stream, "middlebox", streams=counts[-1])
            assert faulted is not None and plain is not None
            _ratio_target(
                out,
                f"{what}: CPU per frame <= 2x pass-through's ({counts[-1]} streams)",
                faulted["proxy_cpu_us_per_frame"],
                plain["proxy_cpu_us_per_frame"],
                2.0,
                "µs/frame",
            )
            # the preset holds frames until 4 KiB fill by design: no latency target for it
            if name == "middlebox_faults" and counts[-1] == 1000 and "added_p99_ms" in faulted:
                out.append(
                    {
                        "target": f"{what} adds < 5 ms p99 at 1000 streams, one worker",
                        "measured": f"{faulted['added_p99_ms']:.2f} ms",
                        "met": faulted["added_p99_ms"] < SATURATION_P99_MS,
                    }
                )
    if mb is not None and nginx is not None:
        _ratio_target(
            out,
            "pass-through CPU per frame <= 1.3x nginx's (1000 streams)",
            mb["proxy_cpu_us_per_frame"],
            nginx["proxy_cpu_us_per_frame"],
            1.3,
            "µs/frame",
        )
    if mb is not None and "added_p99_ms" in mb:
        out.append(
            {
                "target": "pass-through adds < 1 ms p99 at 1000 streams",
                "measured": f"{mb['added_p99_ms']:.2f} ms",
                "met": mb["added_p99_ms"] < 1.0,
            }
        )
    conn = {r["path"]: r for r in results["connect"]}
    like = conn.get("nginx_nokeepalive")
    if like is not None and "middlebox" in conn:
        _ratio_target(
            out,
            "new connections/s >= half of nginx's without upstream keepalive",
            conn["middlebox"]["per_s"],
            like["per_s"],
            -0.5,
            "/s",
        )
        _ratio_target(
            out,
            "setup + response p50 <= 2x nginx's without upstream keepalive",
            conn["middlebox"]["p50_ms"],
            like["p50_ms"],
            2.0,
            "ms",
        )
    page = _row(stream, "middlebox_ui", streams=CONSOLE_STREAMS)
    console = results.get("console")
    if page is not None and console is not None:
        out.append(console_target(console))
        if "feed_updates_per_s" in page:
            out.append(
                {
                    "target": "the console's feed sends <= 10 updates/s (500 streams)",
                    "measured": f"{page['feed_updates_per_s']:.1f} updates/s, "
                    f"{page['feed_kib_per_s']:.0f} KiB/s",
                    "met": page["feed_updates_per_s"] <= 10.5,
                }
            )
    for name, limit in (("middlebox", 16), ("middlebox_faults", 32)):
        row = _row(stream, name, streams=1000) or _row(stream, name, streams=500)
        if row is not None:
            out.append(
                {
                    "target": f"memory per open stream < {limit} KiB ({results['paths'][name]})",
                    "measured": f"{row['rss_kib_per_stream']:.1f} KiB at {row['streams']} streams",
                    "met": row["rss_kib_per_stream"] < limit,
                }
            )
    bulk = {r["path"]: r for r in results["bulk_64k"]}
    if "middlebox_faults" in bulk and "nginx" in bulk:
        for share, least in (("", -1.0), ("0.75x ", -0.75)):
            _ratio_target(
                out,
                f"64 KiB responses through the three-fault path >= {share}nginx's MB/s",
                bulk["middlebox_faults"]["mb_per_s"],
                bulk["nginx"]["mb_per_s"],
                least,
                "MB/s",
            )
    return out


def console_target(console: dict[str, Any]) -> dict[str, Any]:
    """The page's cost: its direct CPU as the console counts it, and the CPU per frame of
    alternating pairs without and with it; met when both hold (docs/ui.md says why)."""
    pairs = console["pairs"]
    shares = ", ".join(f"{p['page_share']:.1%}" for p in pairs)
    ratios = ", ".join(f"{p['ratio']:.2f}" for p in pairs)
    return {
        "target": f"a live console page costs <= 10% of the proxy's CPU "
        f"({console['streams']} streams, --ui with the page against --ui without)",
        "measured": f"the page's own CPU {console['page_share']:.1%} of the rest (median of "
        f"{len(pairs)} windows: {shares}); CPU per frame with / without, median of "
        f"{len(pairs)} alternating pairs {console['median_ratio']:.2f}x ({ratios})",
        "met": console["page_share"] <= 0.10 and console["median_ratio"] <= 1.10,
    }


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "os": platform.freedesktop_os_release().get("PRETTY_NAME", "")
        if hasattr(platform, "freedesktop_os_release")
        else "",
        "load_average_at_start": os.getloadavg()[0],
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }


def _first_line(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (
        (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else ""
    )


def versions(nginx: str | None) -> dict[str, str]:
    import trio

    import middlebox

    commit = _first_line(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return {
        "middlebox": f"{middlebox.__version__} ({commit})" if commit else middlebox.__version__,
        "python": platform.python_version(),
        "trio": trio.__version__,
        "nginx": _first_line([nginx, "-v"]) if nginx else "not installed",
        "gcc": _first_line(["gcc", "--version"]),
    }


def ensure_nginx(log: Callable[[str], None]) -> None:
    """Install Debian's nginx when missing (root only); the bench runs it itself, never as
    a service."""
    if shutil.which("nginx") or Path("/usr/sbin/nginx").exists():
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        log("nginx missing and cannot be installed here: nginx rows are skipped")
        return
    log("installing nginx (Debian package) ...")
    env = os.environ | {"DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "nginx"],
    ):
        subprocess.run(argv, env=env, check=False, stdout=subprocess.DEVNULL, timeout=300)
    # A package's postinst may start the system service on port 80; it is not ours to
    # stop, and it does not touch our ports, so it is left alone.


@contextmanager
def machine_to_itself(log: Callable[[str], None]) -> Iterator[None]:
    """Hold `BENCH_LOCK` while measuring: the ports are fixed and the numbers are only
    worth something with no other bench on the cores."""
    with open(BENCH_LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another bench holds {BENCH_LOCK}; waiting for it")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run_suite(settings: Settings, log: Callable[[str], None] = print) -> dict[str, Any]:
    ensure_nginx(log)
    with machine_to_itself(log), tempfile.TemporaryDirectory(prefix="middlebox-bench-") as tmp:
        return Bench(Path(tmp), settings, log).run()
