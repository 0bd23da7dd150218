"""The nightly workflow users copy runs what the README says, gates, writes JUnit, compares with the
previous night and keeps its results under the name it downloads them by (actionlint: .ci/run)."""

import re

import yaml

from tests.conftest import ROOT


def test_nightly_workflow_uses_the_readme_command_and_every_gate():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    main = re.findall(r"```sh\n(.*?)\n```", section, re.S)[0]
    setup, run = [part.strip() for part in main.split("&&")]
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "nightly.yml").read_text())
    experiment = workflow["env"]["EXPERIMENT"]
    assert run == f".venv/bin/testbed run {experiment}"
    assert (ROOT / experiment).exists() and f"name: {workflow['env']['NAME']}\n" in (ROOT / experiment).read_text()
    steps = workflow["jobs"]["nightly"]["steps"]
    scripts = "\n".join(step.get("run", "") for step in steps)
    assert f"sudo {setup} && sudo .venv/bin/testbed run \"$EXPERIMENT\" --out results --check" in scripts
    assert "testbed check" in scripts and "--junit" in scripts and "--against" in scripts
    upload = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact")]
    assert len(upload) == 1 and upload[0]["with"]["path"] == "results/" and upload[0]["if"] == "always()"
    assert f"--name {upload[0]['with']['name']}" in scripts  # tomorrow downloads what tonight uploads
    assert all(s.get("if") == "always()" for s in steps[2:])  # a missed gate still reports and keeps results
    assert "./scripts/lint-workflows" in (ROOT / ".ci" / "run").read_text()
