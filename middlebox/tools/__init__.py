"""tools: load generation, the Locust file, the soak test, the cassette recorder, the probe
upstream, the fingerprinter that measures a path in front of it, and its canary
(`fingerprint --watch`, Prometheus gauges).

Rule: may import core, scenario, shell, observe, run and the composition root; nothing
imports tools.
"""
