"""Every command on docs/getting-started.md runs, as written: the page is what a newcomer types first.

The install lines are CI's own (`.ci/run` runs `./scripts/setup --tests` before the suite), so they are checked
against README and CI rather than run again. The tour (`plan`, `whatif`) runs without root in a scratch
directory; the first emulation (up ... down) runs as root on its own prefix; the first experiment is the session's
`netns_quickstart` run (the page's command, restricted to one cell), and `report` is run on its directory.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, QuickstartRun, namespaces_with

PAGE = ROOT / "docs" / "getting-started.md"
TOUR = ("plan", "whatif")
EMULATION = ("up", "status", "probe", "exec", "shape", "fault", "down")


def page_commands() -> list[str]:
    """Every line of every sh block of the page, in order."""
    blocks = re.findall(r"```sh\n(.*?)\n```", PAGE.read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def subcommand(line: str) -> str | None:
    match = re.match(r"\.venv/bin/testbed (\w+)", line)
    return match.group(1) if match else None


def shell(line: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=os.environ.copy())


def scratch_checkout(tmp_path: Path) -> Path:
    """A directory that looks like a checkout (the venv and the shipped files linked) so that what the commands
    write (results/) lands in the test's own directory."""
    for name in (".venv", "experiments", "scenarios", "topologies", "examples"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


def test_every_command_of_the_page_is_covered():
    commands = page_commands()
    covered = {"./scripts/setup", "./scripts/setup --tests"}
    for line in commands:
        assert line in covered or subcommand(line) in (*TOUR, *EMULATION, "run", "report"), \
            f"{line}: a command on the Getting-started page that no test runs"
    assert [subcommand(c) for c in commands if subcommand(c) in EMULATION] == list(EMULATION), \
        "the first emulation is walked through in this order"


def test_install_lines_are_readmes_and_cis():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    setup = [c for c in page_commands() if c.startswith("./scripts/setup")]
    assert setup == ["./scripts/setup", "./scripts/setup --tests"]
    assert "./scripts/setup && .venv/bin/testbed run experiments/quickstart.yaml" in readme
    assert "./scripts/setup --tests && .venv/bin/python -m pytest" in ci


def test_the_tour_runs_without_building_anything(tmp_path: Path):
    cwd = scratch_checkout(tmp_path)
    tour = [c for c in page_commands() if subcommand(c) in TOUR]
    assert [subcommand(c) for c in tour] == list(TOUR)
    for line in tour:
        proc = shell(line, cwd, timeout=120)
        assert proc.returncode == 0, f"{line} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        assert proc.stdout.strip(), f"{line} printed nothing"
    assert list((cwd / "results" / "whatif").glob("*/*.png")), "whatif wrote no plot"


@pytest.mark.root
def test_the_first_emulation_runs_as_written(prefix: str, tmp_path: Path):
    cwd = scratch_checkout(tmp_path)
    outputs = {}
    for line in [c for c in page_commands() if subcommand(c) in EMULATION]:
        proc = shell(line, cwd)
        assert proc.returncode == 0, f"{line} exited {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        outputs[subcommand(line)] = proc.stdout
    assert "default via 198.18.0.1" in outputs["exec"], outputs["exec"]  # east-0 routes through its gateway
    assert "east" in outputs["status"] and "west" in outputs["status"]
    assert namespaces_with(prefix) == [], "down left namespaces behind"


@pytest.mark.root
def test_the_first_experiment_runs_and_its_report_rebuilds(netns_quickstart: QuickstartRun, tmp_path: Path):
    run_line = next(c for c in page_commands() if subcommand(c) == "run")
    assert run_line == ".venv/bin/testbed run experiments/quickstart.yaml"  # what netns_quickstart runs (one cell)
    proc = netns_quickstart.proc
    assert proc.returncode == 0, f"the quickstart failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    assert netns_quickstart.run_dir is not None
    report_line = next(c for c in page_commands() if subcommand(c) == "report")
    cwd = scratch_checkout(tmp_path)
    (cwd / "results" / "quickstart").mkdir(parents=True)
    (cwd / "results" / "quickstart" / "run").symlink_to(netns_quickstart.run_dir)
    proc = shell(report_line.replace("<run>", "run"), cwd)
    assert proc.returncode == 0, f"{report_line} exited {proc.returncode}:\n{proc.stderr[-2000:]}"
    assert (netns_quickstart.run_dir / "report.html").stat().st_size > 0
