"""vllm_emulator: an upstream that behaves like vLLM's OpenAI server, down to the byte.

Pure core: `wire` (frames per version profile), `textgen` (seeded text), `schedule`
(timing model), `validation`, `metrics`, `config`, `ledger` (the per-request record),
`host` (what a vLLM CPU build takes from the machine it runs on).
Shell (aiohttp, asyncio): `engine` (drives the scheduler on a loop timer), `handlers`
(vLLM's routes), `serve` (the runner and the readiness banner), `cli`
(`python -m vllm_emulator`, the `emulate` click command), `cassette`.
Public entry points: `vllm_emulator.serve.run_emulator(config, host, port, ready)` and
`vllm_emulator.config.EmulatorConfig`. This package imports neither `middlebox` nor
`faults`, and this file imports nothing, so the pure modules stay free of aiohttp.
See docs/emulator.md for the ledger contract and the resume protocol.
"""
