"""tools: load generation, the Locust file, the soak test, the cassette recorder and the probe
upstream.

Rule: may import core, scenario, shell, observe, run and the composition root; nothing
imports tools.
"""
