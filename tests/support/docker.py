"""Docker tests (the image they run is built once per session: tests/conftest.py's docker_image), and a check
that nothing labelled stays."""

from __future__ import annotations


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
