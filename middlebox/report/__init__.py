"""report: views of a run's plain-data verdicts: the scorecard, JUnit XML, the HTML report,
timelines and progress.

Every view takes the report document (`report.json`'s content: dicts and lists), so a saved
report renders like a fresh run. `layout` says where a run's files lie (shared with run/).

Rule: imports core, scenario and observe; never run (it renders data, it does not drive runs).
"""
