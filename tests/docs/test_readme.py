"""README fits a screen, holds exactly two set-up commands (CI runs the second one verbatim), and carries no
measurement history: no commit ids, no issue numbers, no paths outside the repository, no dead links."""

import re

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_readme_has_two_commands_and_ci_runs_the_test_one():
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    main, tests = commands
    assert main == "./scripts/setup && .venv/bin/testbed run experiments/quickstart.yaml"
    assert tests == "./scripts/setup --tests && .venv/bin/python -m pytest -q -p no:cacheprovider"
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_readme_fits_a_screen_and_holds_no_history():
    assert len(README.splitlines()) <= 200
    assert not re.search(r"\b[0-9a-f]{7,40}\b", README), "a commit id"
    assert not re.search(r"\bissues? \d+|#\d+\b", README, re.I), "an issue number"
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "a dated measurement"
    assert "../" not in README and "shared/" not in README, "a path outside the repository"


def test_readme_links_and_picture_exist():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert any(t.endswith(".png") for t in targets), "the picture"
    for target in targets:
        if "://" not in target:
            assert (ROOT / target).exists(), f"README links to {target}, which is not in the repository"


def test_readme_says_how_to_run_the_quick_part():
    assert 'pytest -m "not (docker or uml)"' in README
