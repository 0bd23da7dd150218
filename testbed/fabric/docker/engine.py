"""The docker engine: a client for it, and removing what carries our label (no state needed)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from testbed.fabric.errors import FabricError
from testbed.plan.containers import LABEL
from testbed.waiting import wait_for

CLEAN_BUSY_TIMEOUT_S = 30.0


def docker_client(timeout: int = 120) -> Any:
    """The docker engine named by the environment (DOCKER_HOST, or the local socket)."""
    import docker

    try:
        client = docker.from_env(timeout=timeout, max_pool_size=64)
        client.ping()
    except Exception as error:  # docker.errors.DockerException and connection errors alike
        raise FabricError(f"docker: no engine answers ({error}); start dockerd or Docker Desktop") from None
    return client


def engine_available() -> bool:
    """Whether a docker engine is configured here at all (cheap: no connection for netns-only machines)."""
    return bool(os.environ.get("DOCKER_HOST")) or Path("/var/run/docker.sock").exists()


def clean(prefix: str, settle: float = 0.0, client: Any = None) -> list[str]:
    """Remove every container and network labelled `testbed=<prefix>`; nothing when no engine answers.

    `settle`: keep looking that long after the last removal. A request cut short by Ctrl-C may still be
    carried out by the engine (a container appears after we listed), so an interrupted `up` settles."""
    own = client is None
    if own:
        try:
            client = docker_client(timeout=30)
        except FabricError:
            return []
    from docker.errors import APIError, NotFound

    removed: list[str] = []
    label = {"label": f"{LABEL}={prefix}"}
    deadline = time.monotonic() + settle + CLEAN_BUSY_TIMEOUT_S
    quiet_since = [time.monotonic()]

    def sweep() -> bool:
        """One pass; True once nothing is left and nothing appeared for `settle` seconds."""
        busy: list[str] = []  # objects the engine would not remove yet (a container still being created)
        for container in client.containers.list(all=True, filters=label, ignore_removed=True):
            try:
                container.remove(force=True)
                removed.append(f"{container.name} (container)")
            except NotFound:
                pass
            except APIError as error:
                busy.append(f"{container.name}: {error.explanation or error}")
            quiet_since[0] = time.monotonic()
        for network in client.networks.list(filters=label):
            try:
                network.remove()
                removed.append(f"{network.name} (network)")
            except NotFound:
                pass
            except APIError as error:  # e.g. an endpoint of a container created after we listed
                busy.append(f"{network.name}: {error.explanation or error}")
            quiet_since[0] = time.monotonic()
        if busy and time.monotonic() > deadline:
            raise FabricError(f"docker: could not remove {'; '.join(busy)}")
        return not busy and time.monotonic() - quiet_since[0] >= settle

    try:
        wait_for(sweep, None, interval=0.2)
    finally:
        if own:
            client.close()
    return removed


def remove_images() -> list[str]:
    """Remove every image labelled `testbed` (project images first: the bases are their parents)."""
    client = docker_client(timeout=120)
    removed: list[str] = []
    try:
        for role in ("image", "base"):
            for image in client.images.list(filters={"label": f"{LABEL}={role}"}):
                client.images.remove(image.id, force=True)
                removed.append(f"{', '.join(image.tags) or image.short_id} (image)")
    finally:
        client.close()
    return removed
