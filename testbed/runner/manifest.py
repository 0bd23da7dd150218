"""A run's manifest.json: what ran (the experiment's text and hash), where (kernel, CPUs, backend, shaper, the links as
set, the nodes' TCP) and with what (git commit, package versions)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from testbed.fabric.lifecycle import Testbed
from testbed.runner.links import node_tcp
from testbed.spec.experiment import Experiment

ROOT = Path(__file__).resolve().parents[2]


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("testbed", "torch", "pyroute2", "pydantic", "pandas", "matplotlib"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def manifest(experiment: Experiment, source: Path | None, testbed: Testbed, extra: dict | None = None) -> dict:
    text = source.read_text() if source else json.dumps(experiment.model_dump(mode="json"))
    return {
        "experiment": experiment.name, "experiment_file": str(source) if source else None,
        "experiment_sha256": hashlib.sha256(text.encode()).hexdigest(), "experiment_text": text,
        "description": experiment.description, "git_commit": git_commit(), "versions": versions(),
        "kernel": platform.release(), "host_cpus": os.cpu_count(), "backend": testbed.state.backend,
        "shaper": testbed.plan.shaper, "tcp": node_tcp(testbed),
        "links": {end.key: {**end.shaping.params.describe(), "shaper": testbed.plan.shaper,
                            "mechanism": testbed.mechanism(end)}
                  for end in testbed.plan.link_ends if end.kind == "inter-dc"},
        "topology": testbed.topology.model_dump(mode="json"), "seed": experiment.workload.seed,
        "warmup_steps": experiment.workload.warmup_steps, "repetitions": experiment.repetitions,
        "started": datetime.now(UTC).isoformat(), **(extra or {}),
    }
