"""`python -m middlebox` is the `middlebox` command."""

from middlebox.cli import main

main()
