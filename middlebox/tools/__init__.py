"""tools: load generation, the Locust file, the soak test and the cassette recorder.

Rule: may import core, scenario, shell, observe and run; nothing imports tools.
"""
