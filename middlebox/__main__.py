"""`python -m middlebox` is the `middlebox` command."""

from middlebox.cli.main import main

main()
