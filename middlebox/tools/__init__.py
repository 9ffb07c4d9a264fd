"""tools: load generation, the Locust file, the soak test, the cassette recorder, the probe
upstream and the fingerprinter that measures a path in front of it.

Rule: may import core, scenario, shell, observe, run and the composition root; nothing
imports tools.
"""
