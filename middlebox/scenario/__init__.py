"""scenario: the YAML scenario format, one job per module.

units     durations (`800ms`) and sizes (`4KiB`)
convert   YAML nodes to checked dataclasses; problems at file:line:column
model     the validated scenario (frozen dataclasses) and its warnings
load      files and text to a Scenario: limits, top-level keys, the fault path
presets   `- preset: NAME` (and its `set:`) expanded in a path
schema    the JSON Schema of the format, generated from the registry
workload  the clients' `workload:` block
expect    the `expect:` block: its metric names and conditions, checked where they stand
probe_shape  the probe upstream's stream shapes: knobs, frames and the plan of writes
fingerprint  what a path did to probe shapes: hold, framing, headers, compression, SSE fields,
             a client's leave, timeouts, a duration cap
fit       the scenario whose faults do what a fingerprint measured; the closest preset
canary    the canary's round (`fingerprint --watch`): added TTFT, bytes held, cancel time

Rule: pure (core + pyyaml); never imports faults (the registry is passed in by the
composition root), the shell, or anything that runs.
"""
