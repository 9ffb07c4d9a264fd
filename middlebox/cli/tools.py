"""`middlebox validate`, `schema`, `pcap`, `record`, `load`, `probe-upstream` and
`fingerprint`: the scenario format and the tools around a run, each command one call into
the room that does the work."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import click

from middlebox.cli.addresses import PORT, listen_address, upstream_address
from middlebox.cli.targets import scenario_targets


@click.command()
@click.argument("paths", nargs=-1, required=True, callback=scenario_targets)
def validate(paths: tuple[str, ...]) -> None:
    """Check scenario files (or directories of them, or library scenarios by name); print
    every problem with its line.

    \b
    Example:
      middlebox validate my-scenarios/ my-incident.yaml
    """
    from middlebox.clients import BUILTIN_CLIENTS
    from middlebox.compose import NoScenarioFiles, validate_paths

    try:
        good, problems = validate_paths(paths, clients=list(BUILTIN_CLIENTS))
    except NoScenarioFiles as error:
        raise click.UsageError(str(error)) from None  # as `run` says it: exit 2
    for scenario in good:
        click.echo(f"ok: {scenario.source} ({scenario.name}, {len(scenario.path)} faults)")
        for warning in scenario.warnings:
            click.echo(f"warning: {warning}", err=True)
    for problem in problems:
        click.echo(f"error: {problem}", err=True)
    if problems:
        sys.exit(1)


@click.command()
def schema() -> None:
    """Print the JSON Schema of the scenario format, generated from the fault registry.

    \b
    Example:
      middlebox schema > scenario.schema.json
    """
    from middlebox.compose import json_schema

    click.echo(json.dumps(json_schema(), indent=2))


@click.command()
@click.argument("journal", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(dir_okay=False),
    help="run.pcapng, or run.pcap (no packet comments); no other suffix",
)
@click.option("--listen-port", default=9000, show_default=True, type=PORT,
              help="Proxy port in the capture.")  # fmt: skip
@click.option("--upstream-port", default=8000, show_default=True, type=PORT,
              help="Upstream port shown.")  # fmt: skip
def pcap(journal: str, output: str, listen_port: int, upstream_port: int) -> None:
    """Turn a connection journal (NDJSON) into TCP packets for Wireshark or tshark.

    Both legs of each connection become TCP streams on 127.0.0.1 with sequence numbers
    from the journal's offsets, FINs and RSTs where the journal saw them.

    \b
    Example:
      middlebox pcap reports/latest/runs/00-x/raw.journal.ndjson -o run.pcapng
      tshark -r run.pcapng -Y 'tcp.flags.reset == 1'
    """
    from middlebox.observe.journal import JournalError
    from middlebox.observe.pcap import CaptureError, write_pcap

    try:
        count = write_pcap(journal, output, listen_port=listen_port, upstream_port=upstream_port)
    except (CaptureError, JournalError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(f"wrote {count} packets to {output}")


@click.command()
@click.option("--upstream", required=True, callback=upstream_address,
              help="The real server, e.g. http://127.0.0.1:8000.")  # fmt: skip
@click.option("--listen", "listen_at", default="127.0.0.1:9000", show_default=True,
              callback=listen_address)  # fmt: skip
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Cassette dir.")
def record(upstream: str, listen_at: str, out: str) -> None:
    """Proxy to a real server and save each response as an emulator cassette.

    \b
    Example:
      middlebox record --upstream http://127.0.0.1:8000 --listen 127.0.0.1:9000 --out tapes/
      # replay one: upstream: {cassette: tapes/cassette-0001-0.json} in a scenario
    """
    import trio

    from middlebox.cli.proxy import say, startup_error
    from middlebox.shell.server import Address, ListenError
    from middlebox.tools.record import record as record_responses

    listening, recorded = Address.parse(listen_at), Address.parse(upstream)  # checked by click

    def ready(port: int) -> None:
        say(f"recording http://{listening.host}:{port} -> {recorded}")

    def saved(path: Path) -> None:
        say(f"saved {path}")

    try:
        trio.run(
            lambda: record_responses(listening, recorded, Path(out), ready=ready, on_cassette=saved)
        )
    except ListenError as error:
        raise click.ClickException(str(startup_error(error, listen_at))) from None
    except KeyboardInterrupt:
        pass


@click.command("probe-upstream")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 to stand behind an ingress).")  # fmt: skip
@click.option("--port", default=0, show_default=True, type=PORT,
              help="Port; 0 picks a free one (the first stdout line says which).")  # fmt: skip
@click.option("--keep", default=256, show_default=True, type=click.IntRange(1, 100_000),
              help="Request records kept for GET /probe/requests/ID (the newest).")  # fmt: skip
def probe_upstream(host: str, port: int, keep: int) -> None:
    """Serve the OpenAI wire with a stream of exactly the shape each request asks for, and
    record what reached it (docs/fingerprint.md).

    \b
    Example:
      middlebox probe-upstream --host 0.0.0.0 --port 8000   # where the LLM server stands
      curl -N https://my-ingress/v1/chat/completions \\
           -H 'X-Middlebox-Probe: frames=10;period=200ms;id=t1' \\
           -d '{"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}'
      curl https://my-ingress/probe/requests/t1   # what arrived, when it learned you left
    """
    from middlebox.cli.proxy import say, startup_error
    from middlebox.tools.probe_upstream import ProbeUpstream

    try:
        server = ProbeUpstream(host, port, keep=keep)
    except OSError as error:
        raise click.ClickException(str(startup_error(error, f"{host}:{port}", "--port"))) from None
    say(f"listening on http://{f'[{host}]' if ':' in host else host}:{server.port}")
    # SIGTERM (docker stop, a Kubernetes pod's end) stops it as Ctrl-C does, exit status 0
    signal.signal(signal.SIGTERM, lambda *_: server.close())
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


@click.command()
@click.argument("url")
@click.option("--direct", metavar="URL",
              help="The probe upstream without the path, measured too as a baseline.")  # fmt: skip
@click.option("--budget", default=60.0, show_default=True, metavar="SECONDS",
              type=click.FloatRange(10, 3600),
              help="Seconds the measures may take in all (split with --direct).")  # fmt: skip
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the measures as JSON to this file.")  # fmt: skip
@click.option("--write", "scenario_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the scenario fitted to the measures (a path: of faults).")  # fmt: skip
@click.option("--verify", is_flag=True,
              help="Play the same measures through `middlebox proxy --scenario` with the "
              "written scenario, in front of a local probe upstream, and print the agreement "
              "measure by measure (needs --write).")  # fmt: skip
@click.option("--watch", "interval", type=click.FloatRange(0.5), metavar="SECONDS",
              help="A canary: every SECONDS, a small grid (one hold, one leave), one line "
              "each, and Prometheus gauges at --metrics-listen (docs/fingerprint.md).")  # fmt: skip
@click.option("--metrics-listen", default="127.0.0.1:9464", show_default=True,
              metavar="HOST:PORT", callback=listen_address,
              help="Where --watch serves GET /metrics (port 0 picks a free one).")  # fmt: skip
@click.option("--count", type=click.IntRange(1), metavar="N",
              help="With --watch: stop after N rounds; exit 1 if any failed.")  # fmt: skip
@click.option("--model", metavar="NAME",
              help="Measure a real OpenAI-compatible LLM server serving NAME (no probe "
              "upstream): burst sizes, TTFT and gaps, headers, compression, cancellation. "
              "Without it, a front door whose /v1/models lists other models than the "
              "probe's is measured so, with the first model listed.")  # fmt: skip
@click.option("--metrics-url", metavar="URL",
              help="The LLM server's Prometheus /metrics, for cancellation (default: the "
              "origin of --direct, else of URL, + /metrics).")  # fmt: skip
def fingerprint(
    url: str,
    direct: str | None,
    budget: float,
    json_path: Path | None,
    scenario_path: Path | None,
    verify: bool,
    interval: float | None,
    metrics_listen: str,
    count: int | None,
    model: str | None,
    metrics_url: str | None,
) -> None:
    """Measure what the path in front of `middlebox probe-upstream` does to a token stream:
    how much it holds and what releases it, the HTTP version and framing each way, the
    headers it changes, whether it honours X-Accel-Buffering: no, compression and its
    flush, SSE comments, `retry:`, `id:` and Last-Event-ID passed or changed, how long until
    the upstream learns that a client left (FIN or RST), the timeouts before and after the
    head, and a duration cap (docs/fingerprint.md).

    \b
    Example:
      middlebox probe-upstream --port 8000             # where the LLM server stands
      middlebox fingerprint https://my-ingress/probe-llm/v1 --direct http://10.0.0.5:8000/v1
      middlebox fingerprint https://my-ingress/probe-llm/v1 --write path.yaml --verify
      middlebox fingerprint https://my-ingress/probe-llm/v1 --watch 60   # a canary

    Against a real LLM server when the probe cannot be deployed (--model, or found from
    /v1/models): burst sizes, TTFT and inter-token gaps, the headers and what the path adds
    (with --direct), compression, and how long until the server stops generating for a
    client that leaves (from its /metrics); what needs the probe is listed as not measured.

    \b
      middlebox fingerprint https://my-ingress/v1 --direct http://10.0.0.5:8000/v1
    """
    from middlebox.tools.fingerprint import FingerprintError, fingerprint_and_fit, write_json

    if interval is not None:
        watch_path(url, interval, metrics_listen, count,
                   direct or json_path or scenario_path or model or metrics_url)  # fmt: skip
        return
    if count is not None:
        raise click.UsageError("--count bounds the rounds of --watch: give --watch SECONDS")
    if verify and scenario_path is None:
        raise click.UsageError("--verify plays the scenario --write writes: give --write PATH")

    def progress(line: str) -> None:
        click.echo(f"fingerprint: {line}", err=True)

    from middlebox.tools import fingerprint_llm

    try:
        if (served := fingerprint_llm.served_model(url, model)) is not None:
            if scenario_path is not None:
                raise fingerprint_llm.refuse_write()
            document = fingerprint_llm.fingerprint_and_say(
                url, model=served, direct=direct, budget=budget, metrics=metrics_url,
                progress=progress, say=click.echo,
            )  # fmt: skip
        else:
            document = fingerprint_and_fit(
                url, direct=direct, budget=budget, scenario=scenario_path, verify=verify,
                progress=progress, say=click.echo,
            )  # fmt: skip
    except FingerprintError as error:
        raise click.ClickException(str(error)) from None
    if json_path is not None:
        try:
            write_json(document, json_path)
        except OSError as error:
            raise click.ClickException(f"{json_path}: cannot write ({error.strerror})") from None


def watch_path(url: str, interval: float, metrics: str, count: int | None, other: object
               ) -> None:  # fmt: skip
    """`fingerprint --watch`: the canary's rounds until Ctrl-C (or --count)."""
    from middlebox.tools.fingerprint import FingerprintError
    from middlebox.tools.fingerprint_watch import watch

    if other:
        raise click.UsageError(
            "--watch runs the canary alone: drop --direct, --json, --write, --model, --metrics-url"
        )

    def stop(*_: object) -> None:
        raise KeyboardInterrupt

    # SIGTERM (docker stop, a Kubernetes pod's end) ends the watch as Ctrl-C does
    signal.signal(signal.SIGTERM, stop)
    try:
        state = watch(url, interval, metrics=metrics, count=count, say=click.echo)
    except FingerprintError as error:
        raise click.ClickException(str(error)) from None
    except KeyboardInterrupt:
        click.echo("stopped")
        return
    if state.failures:
        sys.exit(1)


def show_locustfile(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    """`load --locustfile`: the path, then exit (before --url is asked for)."""
    if not value or ctx.resilient_parsing:
        return
    from middlebox.tools.load import locustfile_path

    click.echo(locustfile_path())
    ctx.exit()


def load_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """`load --url`: an http:// URL it can connect to, or a usage error naming the option."""
    if value is not None:
        from middlebox.tools.load import Target

        try:
            Target.parse(value)
        except ValueError as error:
            raise click.BadParameter(str(error)) from None
    return value


@click.command()
@click.option(
    "--url",
    required=True,
    callback=load_url,
    help="Chat completions URL (through the proxy), e.g. http://127.0.0.1:9000; a bare "
    "host:port URL means /v1/chat/completions.",
)
@click.option("--streams", type=click.IntRange(1, 20000), default=10, show_default=True)
@click.option(
    "--duration",
    type=click.FloatRange(0, 3600, min_open=True),
    default=10.0,
    show_default=True,
    help="Seconds during which users start new requests.",
)
@click.option(
    "--model",
    default="middlebox/emulated-7b",
    show_default=True,
    help="Model name to request (the default is the bundled emulator's).",
)
@click.option("--prompt", default="Tell me a story.", show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=64, show_default=True)
@click.option(
    "--ramp",
    type=click.FloatRange(0, min_open=True),
    default=100.0,
    show_default=True,
    help="Users started per second.",
)
@click.option("--max-requests", type=click.IntRange(1), default=100_000, show_default=True)
@click.option(
    "--request-timeout",
    type=click.FloatRange(0, min_open=True),
    default=60.0,
    show_default=True,
    help="After --duration, how long requests in flight may take before they are cut.",
)
@click.option("--json", "json_file", type=click.Path(dir_okay=False), help="Write the report here.")
@click.option("--locustfile", is_flag=True, expose_value=False, is_eager=True,
              callback=show_locustfile,
              help="Print the installed locustfile's path and exit, for "
              "locust -f \"$(middlebox load --locustfile)\".")  # fmt: skip
def load(
    url: str,
    streams: int,
    duration: float,
    model: str,
    prompt: str,
    max_tokens: int,
    ramp: float,
    max_requests: int,
    request_timeout: float,
    json_file: str | None,
) -> None:
    """Stream many chat completions at once; report TTFT and ITL percentiles at the client.

    Bounded: new requests start for --duration seconds, at most --max-requests in all.
    For distributed load across machines use Locust with the installed locustfile
    (docs/performance.md).

    \b
    Examples:
      middlebox load --url http://127.0.0.1:9000 --streams 200 --duration 30
      locust -f "$(middlebox load --locustfile)" --host http://127.0.0.1:9000
    """
    from middlebox.tools.load import LoadPlan, load_test

    plan = LoadPlan(
        url,
        streams,
        duration,
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        ramp=ramp,
        max_requests=max_requests,
        request_timeout=request_timeout,
    )
    try:
        report = load_test(plan, json_file=Path(json_file) if json_file else None)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(report.text())
    if report.completed == 0:
        sys.exit(1)
