"""middlebox: a fault-injection network middlebox for LLM token streams.

```
 client(s) ──TCP──► middlebox proxy (trio) ──TCP──► upstream (vllm_emulator or a real vLLM)
                    shell: readers ─► Pipeline[fault1 … faultN] (pure, virtual clock) ─► writers
                    observe: journal of every chunk, end and fault decision; legs framed once
 library name or *.yaml ─► scenario loader ─► compose (fault registry) ─► a pipeline per connection
 run: upstream + a proxy per client + client processes ─► score ─► report
```

Rooms, one job and one dependency rule each (each room's `__init__.py` states its rule;
tests/test_architecture.py enforces them; docs/architecture.md has the whole picture):
- `core`: stream items, the fault contract, HTTP/1.1 and SSE framers, responses.
  Standard library only; no event loop, socket, wall clock or global `random`.
- `scenario`: the YAML scenario format. Core + PyYAML; pure like core.
- `library`: the shipped scenarios (by name) and drills, as package data. Standard library
  + PyYAML; imports no other room.
- `compose` (this package's `compose.py`): the composition root, the only importer of
  `faults`, which itself imports only `middlebox.core`.
- `observe`: journal, metrics, pcap. Core + scenario; no event loop.
- `shell`: the trio I/O shell. Core + scenario + observe; never aiohttp; no fault logic.
- `report`: views of plain-data verdicts. Core + scenario + observe; never run.
- `clients`: the built-in clients under test, separate processes. Core + their library.
- `run`: upstream, client runs, suite, scorer, plugin, drills. Every room listed above;
  never tools or cli.
- `tools`: load, Locust, soak, record. Core, scenario, compose, observe, shell and run;
  nothing imports tools.
- `cli`: click only; any room; nothing imports cli.
`vllm_emulator` imports neither `middlebox` nor `faults`; no module imports both trio and
aiohttp.
"""

__version__ = "0.1.0"
