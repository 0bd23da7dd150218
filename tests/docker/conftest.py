"""Docker tests: an image built from this tree by scripts/build-image (its base is cached by a hash of its
inputs and kept; this image is removed after the session), and a check that nothing labelled stays."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from ..conftest import ROOT


@pytest.fixture(scope="session")
def docker_image():
    tag = f"testbed:test-{uuid.uuid4().hex[:6]}"
    proc = subprocess.run([str(ROOT / "scripts" / "build-image"), tag], capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"scripts/build-image failed:\n{proc.stderr[-3000:]}"
    yield tag
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, timeout=120)


def labelled(prefix: str) -> list[str]:
    """Containers and networks labelled `testbed=<prefix>` (what `down` and `clean` must remove)."""
    import docker

    client = docker.from_env()
    try:
        containers = client.containers.list(all=True, filters={"label": f"testbed={prefix}"}, ignore_removed=True)
        found = [f"container {c.name}" for c in containers]
        found += [f"network {n.name}" for n in client.networks.list(filters={"label": f"testbed={prefix}"})]
    finally:
        client.close()
    return found


def router_exec(prefix: str, dc: str, argv: list[str]) -> tuple[int, str]:
    import docker

    client = docker.from_env()
    try:
        (container,) = client.containers.list(filters={"label": [f"testbed={prefix}", f"testbed.dc={dc}",
                                                                  "testbed.role=router"]})
        code, output = container.exec_run(argv)
    finally:
        client.close()
    return code, output.decode(errors="replace")
