"""run: running scenarios for a verdict: upstream processes (emulator or a real vLLM), clients,
the suite, the scorer, the background proxy, the pytest plugin and drills.

Rule: may import every room below it (core, scenario, shell, observe, report, clients) and the
composition root; nothing below imports run.
"""
