"""`python -m testbed` is the `testbed` command (what the image's services run)."""

from testbed.cli import app

app(prog_name="testbed")
