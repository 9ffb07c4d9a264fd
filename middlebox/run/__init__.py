"""run: running scenarios for a verdict: upstream processes (emulator or a real vLLM), clients,
the suite, the scorer, the background proxy, the pytest plugin and drills.

Modules, one job each: `processes` (the one upstream launcher and the child supervisor),
`upstream` (the one client of the upstream's own API: models, ledger, /metrics),
`client_runs` (one client process behind its own proxy), `suite` (scenarios and suites),
`outcome` (plain-data results and the report document), `score` (the scorer), `replay`
(rerun a report), `background` (a proxy in a thread for synchronous callers), `serve`
(`middlebox proxy`'s composition), `plugin` (pytest), `drills`, `live` (the Python API of a
live proxy: a control API client, scenarios built in code, `start_proxy`).

Rule: may import every room below it (core, scenario, shell, observe, report, clients) and the
composition root; nothing below imports run.
"""
