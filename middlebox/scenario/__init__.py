"""scenario: the YAML scenario format: units, the YAML-to-dataclass converter, the model,
loading with file:line:column errors, presets, the JSON Schema, and the clients' workload.

Rule: pure (core + pyyaml); never imports faults (the registry is passed in by the
composition root), the shell, or anything that runs.
"""
