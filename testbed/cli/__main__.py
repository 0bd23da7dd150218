"""`python -m testbed.cli` is the `testbed` command."""

from testbed.cli import main

main()
