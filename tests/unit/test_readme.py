"""README holds exactly two set-up commands, and CI runs the second one verbatim."""

import re

from ..conftest import ROOT


def test_readme_has_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    main, tests = commands
    assert "testbed" in main and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()
