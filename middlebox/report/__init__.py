"""report: views of a run's plain-data verdicts: the scorecard, JUnit XML, the HTML report,
timelines and progress.

Rule: imports core, scenario and observe; never run (it renders data, it does not drive runs).
"""
