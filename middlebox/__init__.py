"""middlebox: a fault-injection network middlebox for LLM token streams.

```
 client(s) ──TCP──► middlebox proxy (trio) ──TCP──► upstream (vllm_emulator or a real vLLM)
                    readers ─► driver: Pipeline[fault1 … faultN] (pure) ─► writers
                    journal: every chunk, boundary, fault decision, close kind
 scenarios/*.yaml ─► scenario loader ─► pipeline factory per connection
 runner: starts upstream + proxy + clients ─► scorer ─► scorecard
```

Dependency rule (enforced by tests/test_architecture.py):
- the pure core (`stream`, `fault`, `http1`, `sse`, `scenario`) imports no trio,
  aiohttp, socket or scapy;
- `faults` imports only `middlebox.{stream, fault, http1, sse}`;
- `middlebox` imports `faults` only at the composition root (`cli`, `runner`);
- `vllm_emulator` imports neither `middlebox` nor `faults`.
"""

__version__ = "0.1.0"
