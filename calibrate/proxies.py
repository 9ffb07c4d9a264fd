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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PACKAGES = {"nginx": "nginx", "haproxy": "haproxy", "apache2": "apache2", "caddy": "caddy"}
APACHE_MODULES = Path("/usr/lib/apache2/modules")
START_TIMEOUT = 15.0
STOP_TIMEOUT = 5.0


@dataclass(frozen=True)
class Setup:
    """How one real proxy is configured for one measurement."""

    software: str  # nginx, haproxy, apache2, caddy
    buffering: bool = True  # nginx: proxy_buffering
    gzip: bool = False  # nginx: gzip on, gzip_types text/event-stream
    read_timeout: float | None = None  # the preset's idle timeout, if overridden


def ensure_installed() -> list[str]:
    """apt-get install the Debian packages of the proxies that are missing; return those
    still missing (no root, no apt)."""
    missing = [pkg for name, pkg in PACKAGES.items() if not binary(name)]
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        print(f"calibrate: apt-get install -y {' '.join(missing)}", flush=True)
        subprocess.run(["apt-get", "update", "-q"], env=env, check=False, timeout=300)
        subprocess.run(
            ["apt-get", "install", "-y", "-q", *missing], env=env, check=False, timeout=600
        )
    return [pkg for name, pkg in PACKAGES.items() if not binary(name)]


def binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


def version(software: str) -> str:
    flag = {"nginx": ["-v"], "haproxy": ["-v"], "apache2": ["-v"], "caddy": ["version"]}
    path = binary(software) or software
    done = subprocess.run([path, *flag[software]], capture_output=True, text=True, timeout=10)
    lines = (done.stdout or done.stderr).strip().splitlines()
    line = lines[0].split(" - ")[0] if lines else ""
    # "nginx version: nginx/1.22.1", "HAProxy version 2.6.12-...", "Server version:
    # Apache/2.4.x (Debian)", and Caddy's bare "v2.6.2".
    line = line.replace("Server version: ", "").replace("nginx version: ", "")
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


def command(setup: Setup, root: Path, port: int, upstream: int) -> tuple[list[str], dict[str, str]]:
    env = dict(os.environ)
    software = setup.software
    if software == "nginx":
        config = root / "nginx.conf"
        config.write_text(nginx_config(setup, root, port, upstream))
        return [binary("nginx") or "nginx", "-p", str(root), "-e", str(root / "error.log"),
                "-c", str(config), "-g", "daemon off;"], env  # fmt: skip
    if software == "haproxy":
        config = root / "haproxy.cfg"
        config.write_text(haproxy_config(setup, root, port, upstream))
        return [binary("haproxy") or "haproxy", "-db", "-f", str(config)], env
    if software == "apache2":
        config = root / "apache2.conf"
        config.write_text(apache_config(setup, root, port, upstream))
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
        return [binary("apache2") or "apache2", "-f", str(config), "-DFOREGROUND"], env
    if software == "caddy":
        config = root / "Caddyfile"
        config.write_text(caddy_config(setup, root, port, upstream))
        env.update(HOME=str(root), XDG_DATA_HOME=str(root), XDG_CONFIG_HOME=str(root))
        return [binary("caddy") or "caddy", "run", "--config", str(config),
                "--adapter", "caddyfile"], env  # fmt: skip
    raise ValueError(f"unknown proxy {software!r}")


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
