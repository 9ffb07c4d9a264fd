"""The real proxies: Debian packages, minimal generated configs, foreground processes.

Each config keeps the proxy's defaults except what the measurement needs (listen on
127.0.0.1, pass to the emulator, write temp and pid files under a temp dir) and, for
the idle case, the one read timeout the preset's `idle_reaper` stands for, set to the
same short value on both sides. Every process is started in the foreground and
stopped by its PID (SIGTERM, then SIGKILL after a bound).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PACKAGES = {"nginx": "nginx", "haproxy": "haproxy", "apache2": "apache2", "caddy": "caddy"}
# Proxies no preset models, fingerprinted by `python -m calibrate.fingerprints`
# (docs/fingerprint.md, "More proxies"): binary -> Debian package.
MORE_PACKAGES = {"lighttpd": "lighttpd", "varnishd": "varnish", "squid": "squid"}
APACHE_MODULES = Path("/usr/lib/apache2/modules")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0


@dataclass(frozen=True)
class Setup:
    """How one real proxy is configured for one measurement."""

    software: str  # nginx, haproxy, apache2, caddy; lighttpd, varnishd, squid
    # False: the proxy's streaming knob (nginx: proxy_buffering off; lighttpd:
    # server.stream-response-body 2)
    buffering: bool = True
    gzip: bool = False  # nginx: gzip on, gzip_types text/event-stream
    read_timeout: float | None = None  # the preset's idle timeout, if overridden


def ensure_installed(packages: dict[str, str] = PACKAGES) -> list[str]:
    """apt-get install the Debian packages of the proxies (binary -> package) that are
    missing; return those still missing (no root, no apt)."""
    missing = [pkg for name, pkg in packages.items() if not binary(name)]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print(f"calibrate: apt-get install -y {' '.join(missing)}", flush=True)
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *missing], env=env, check=False, timeout=600
        )
    return [pkg for name, pkg in packages.items() if not binary(name)]


def binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def version(software: str) -> str:
    flag = {"nginx": ["-v"], "haproxy": ["-v"], "apache2": ["-v"], "caddy": ["version"],
            "lighttpd": ["-v"], "varnishd": ["-V"], "squid": ["-v"]}  # fmt: skip
    path = binary(software) or software
    done = subprocess.run([path, *flag[software]], capture_output=True, text=True, timeout=10)
    lines = (done.stdout or done.stderr).strip().splitlines()
    line = lines[0].split(" - ")[0] if lines else ""
    # "nginx version: nginx/1.22.1", "HAProxy version 2.6.12-...", "Server version:
    # Apache/2.4.x (Debian)", Caddy's bare "v2.6.2", "lighttpd/1.4.69 (ssl) - a light...",
    # "varnishd (varnish-7.1.1 revision ...)", "Squid Cache: Version 5.7".
    line = line.replace("Server version: ", "").replace("nginx version: ", "")
    line = line.replace("Squid Cache: Version ", "Squid ").replace(" (ssl)", "")
    line = line.replace("varnishd (varnish-", "Varnish ").split(" revision")[0]
    return line if software != "caddy" else f"Caddy {line}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _seconds(value: float) -> str:
    return f"{round(value * 1000)}ms"


def nginx_config(setup: Setup, root: Path, port: int, upstream: int) -> str:
    # Only what nginx needs to run unprivileged-path; every proxy_* directive is left
    # at its default (proxy_http_version 1.0, proxy_buffering on, proxy_buffers 8 4k|8k,
    # proxy_buffer_size 4k|8k, proxy_read_timeout 60s) unless the setup says otherwise.
    extra = []
    if not setup.buffering:
        extra.append("proxy_buffering off;")
    if setup.read_timeout is not None:
        extra.append(f"proxy_read_timeout {_seconds(setup.read_timeout)};")
    if setup.gzip:
        extra.append("gzip on; gzip_types text/event-stream;")
    user = "user root;" if os.geteuid() == 0 else ""
    return f"""{user}
worker_processes 1;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {root}/client_body;
    proxy_temp_path {root}/proxy_temp;
    fastcgi_temp_path {root}/fastcgi_temp;
    uwsgi_temp_path {root}/uwsgi_temp;
    scgi_temp_path {root}/scgi_temp;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            {" ".join(extra)}
        }}
    }}
}}
"""


def haproxy_config(setup: Setup, root: Path, port: int, upstream: int) -> str:
    # The `defaults` of Debian's shipped /etc/haproxy/haproxy.cfg (mode http, timeout
    # connect 5000, client 50000, server 50000); logging and the stats socket left out.
    server = 50000 if setup.read_timeout is None else round(setup.read_timeout * 1000)
    return f"""global
    maxconn 256
defaults
    mode http
    timeout connect 5000
    timeout client 50000
    timeout server {server}
frontend calibrate
    bind 127.0.0.1:{port}
    default_backend emulator
backend emulator
    server emulator 127.0.0.1:{upstream}
"""


def apache_config(setup: Setup, root: Path, port: int, upstream: int) -> str:
    # Debian's apache2.conf sets Timeout 300 (the compiled default is 60), and
    # ProxyTimeout defaults to Timeout. mpm_event and the modules Debian enables that
    # touch a proxied response (deflate, filter: text/event-stream is not in Debian's
    # AddOutputFilterByType list, so they stay out of the way).
    modules = [
        ("mpm_event_module", "mod_mpm_event.so"),
        ("authz_core_module", "mod_authz_core.so"),
        ("filter_module", "mod_filter.so"),
        ("deflate_module", "mod_deflate.so"),
        ("mime_module", "mod_mime.so"),
        ("proxy_module", "mod_proxy.so"),
        ("proxy_http_module", "mod_proxy_http.so"),
    ]
    loads = "\n".join(f"LoadModule {name} {APACHE_MODULES / so}" for name, so in modules)
    timeout = (
        f"ProxyTimeout {max(1, round(setup.read_timeout))}"
        if setup.read_timeout is not None
        else ""
    )
    user = "User www-data\nGroup www-data" if os.geteuid() == 0 else ""
    return f"""{loads}
ServerRoot {root}
ServerName 127.0.0.1
PidFile {root}/apache2.pid
Mutex file:{root} default
ErrorLog {root}/error.log
LogLevel warn
TypesConfig /etc/mime.types
{user}
Listen 127.0.0.1:{port}
Timeout 300
KeepAlive On
MaxKeepAliveRequests 100
KeepAliveTimeout 5
<IfModule mod_deflate.c>
    AddOutputFilterByType DEFLATE text/html text/plain text/xml text/css text/javascript
    AddOutputFilterByType DEFLATE application/javascript application/rss+xml application/xml
</IfModule>
{timeout}
ProxyPass / http://127.0.0.1:{upstream}/
"""


def caddy_config(setup: Setup, root: Path, port: int, upstream: int) -> str:
    # reverse_proxy with no options: Caddy flushes text/event-stream responses at once
    # (flush_interval -1 for that type) and sets no read timeout on the transport.
    transport = (
        f"transport http {{\n            read_timeout {_seconds(setup.read_timeout)}\n        }}"
        if setup.read_timeout is not None
        else ""
    )
    return f"""{{
    admin off
    auto_https off
    storage file_system {root}/storage
}}
http://127.0.0.1:{port} {{
    reverse_proxy 127.0.0.1:{upstream} {{
        {transport}
    }}
}}
"""


def lighttpd_config(setup: Setup, root: Path, port: int, upstream: int) -> str:
    # Debian's lighttpd.conf (feature flags and parse options kept) with mod_proxy in
    # place of the modules that serve files, and proxy.server with no options: no
    # backend read-timeout, and server.stream-response-body 0 (lighttpd's default:
    # the backend's response body is read whole before the client gets it) unless the
    # setup streams (2: "stream response body to client; minimal buffering").
    user = 'server.username = "www-data"\nserver.groupname = "www-data"'
    stream = "" if setup.buffering else "server.stream-response-body = 2"
    timeout = (
        f', "read-timeout" => {max(1, round(setup.read_timeout))}'
        if setup.read_timeout is not None
        else ""
    )
    return f"""server.modules = ( "mod_proxy" )
server.document-root = "{root}"
server.upload-dirs = ( "{root}" )
server.pid-file = "{root}/lighttpd.pid"
{user if os.geteuid() == 0 else ""}
server.bind = "127.0.0.1"
server.port = {port}
server.feature-flags += ("server.h2proto" => "enable")
server.feature-flags += ("server.h2c" => "enable")
server.feature-flags += ("server.graceful-shutdown-timeout" => 5)
server.http-parseopts = (
  "header-strict" => "enable", "host-strict" => "enable", "host-normalize" => "enable",
  "url-normalize-unreserved" => "enable", "url-normalize-required" => "enable",
  "url-ctrls-reject" => "enable", "url-path-2f-decode" => "enable",
  "url-path-dotseg-remove" => "enable",
)
{stream}
proxy.server = ( "" => ( ( "host" => "127.0.0.1", "port" => {upstream}{timeout} ) ) )
"""


def varnish_vcl(setup: Setup, root: Path, port: int, upstream: int) -> str:
    # Debian's default.vcl: a backend and the builtin VCL (a POST is passed, never
    # cached; a passed response streams, beresp.do_stream true). between_bytes_timeout
    # and first_byte_timeout default to 60 s (varnishd's parameters).
    timeout = (
        f".between_bytes_timeout = {_seconds(setup.read_timeout)};"
        if setup.read_timeout is not None
        else ""
    )
    # One rule added for the measurement, not the path: the builtin VCL caches a GET's
    # 200 for default_ttl (120 s), so a fingerprinter polling the probe's record of a
    # request (GET .../probe/requests/ID) would read its first answer again and again;
    # the record route is passed. The chat route is a POST, passed by the builtin VCL.
    return f"""vcl 4.1;
backend default {{
    .host = "127.0.0.1";
    .port = "{upstream}";
    {timeout}
}}
sub vcl_recv {{
    if (req.url ~ "/probe/requests") {{
        return (pass);
    }}
}}
"""


def squid_config(setup: Setup, root: Path, port: int, upstream: int) -> str:
    # A reverse proxy ("accelerator") with Debian's squid.conf access rules (localhost
    # allowed, the rest denied) and its defaults otherwise: memory cache only,
    # read_timeout 15 minutes; the setup's read timeout sets read_timeout.
    timeout = (
        f"read_timeout {max(1, round(setup.read_timeout))} seconds"
        if setup.read_timeout is not None
        else ""
    )
    user = "cache_effective_user proxy" if os.geteuid() == 0 else ""
    return f"""http_port 127.0.0.1:{port} accel defaultsite=127.0.0.1:{upstream} no-vhost
cache_peer 127.0.0.1 parent {upstream} 0 no-query originserver name=probe
http_access allow localhost
http_access deny all
pid_filename {root}/squid.pid
cache_log {root}/cache.log
access_log none
coredump_dir {root}
{user}
{timeout}
"""


CONFIGS: dict[str, tuple[str, Callable[[Setup, Path, int, int], str]]] = {
    "nginx": ("nginx.conf", nginx_config),
    "haproxy": ("haproxy.cfg", haproxy_config),
    "apache2": ("apache2.conf", apache_config),
    "caddy": ("Caddyfile", caddy_config),
    "lighttpd": ("lighttpd.conf", lighttpd_config),
    "varnishd": ("default.vcl", varnish_vcl),
    "squid": ("squid.conf", squid_config),
}


def command(setup: Setup, root: Path, port: int, upstream: int) -> tuple[list[str], dict[str, str]]:
    """Write the setup's config under `root`; the argv that runs the proxy in the
    foreground with it, and its environment."""
    env = dict(os.environ)
    software = setup.software
    if software not in CONFIGS:
        raise ValueError(f"unknown proxy {software!r}")
    name, render = CONFIGS[software]
    config = root / name
    config.write_text(render(setup, root, port, upstream))
    program = binary(software) or software
    if software == "nginx":
        return [program, "-p", str(root), "-e", str(root / "error.log"),
                "-c", str(config), "-g", "daemon off;"], env  # fmt: skip
    if software == "haproxy":
        return [program, "-db", "-f", str(config)], env
    if software == "apache2":
        # Debian's apache2 reads these from /etc/apache2/envvars; set them here so the
        # binary runs outside apache2ctl.
        env.update(
            APACHE_RUN_USER="www-data",
            APACHE_RUN_GROUP="www-data",
            APACHE_PID_FILE=str(root / "apache2.pid"),
            APACHE_RUN_DIR=str(root),
            APACHE_LOCK_DIR=str(root),
            APACHE_LOG_DIR=str(root),
        )
        return [program, "-f", str(config), "-DFOREGROUND"], env
    if software == "caddy":
        env.update(HOME=str(root), XDG_DATA_HOME=str(root), XDG_CONFIG_HOME=str(root))
        return [program, "run", "--config", str(config), "--adapter", "caddyfile"], env
    if software == "lighttpd":
        return [program, "-D", "-f", str(config)], env
    if software == "varnishd":
        # Debian's varnish.service (a 256 MiB malloc storage), less the management port
        # (-T none) and the jail's user (-j none: its vcache user cannot read a private
        # temp dir); -n keeps the working directory under `root`.
        return [program, "-F", "-j", "none", "-a", f"127.0.0.1:{port}", "-f", str(config),
                "-n", str(root / "varnish"), "-T", "none", "-s", "malloc,256m"], env  # fmt: skip
    return [program, "-N", "-f", str(config)], env  # squid


@contextmanager
def running(setup: Setup, upstream: int, root: Path) -> Iterator[int]:
    """Run the real proxy in the foreground for the block; yield the port it listens on."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)  # workers run as www-data (Apache) and must reach the mutex dir
    port = free_port()
    argv, env = command(setup, root, port, upstream)
    log = (root / "stdout.log").open("wb")
    process = subprocess.Popen(
        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        _wait_listening(port, process, root, argv[0])
        yield port
    finally:
        stop(process)
        log.close()


def _wait_listening(port: int, process: subprocess.Popen[bytes], root: Path, name: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = (root / "stdout.log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited {process.returncode}: {output}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on {port} within {START_TIMEOUT}s")


def stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we started (the proxy's workers are in it), then kill."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT)
