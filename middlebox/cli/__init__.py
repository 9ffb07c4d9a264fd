"""cli: the click command line; each command parses its options and calls one function.

Rule: click lives here only; imports any room; nothing imports cli.
"""
