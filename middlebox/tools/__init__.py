"""tools: load generation, the Locust file, the soak test and the cassette recorder.

Rule: may import core, scenario, shell, observe, run and the composition root; nothing
imports tools.
"""
