"""The hijacked sockets of docker execs the fabric keeps open (a router's or node's kept shell, a fork server's
channel) outlive a full garbage collection (root, in CI)."""

from __future__ import annotations

import gc
import weakref

import pytest

from testbed.fabric.docker.process import ExecShell
from tests.support.docker import labelled

pytestmark = [pytest.mark.root, pytest.mark.docker]


def test_a_kept_shell_keeps_its_http_response_through_a_full_collection(prefix, docker_image):
    """docker-py hands back the socket inside an object that holds the exec's HTTP response; the shell used to
    keep only the socket, so a full collection (the fault driver's before its clock starts) took the response,
    and CI saw a router's kept shell fail with "[Errno 9] Bad file descriptor" (two shells opened at once with a
    collection between their scripts failed 3 of 60 times here). The response must live as long as the shell."""
    import docker

    client = docker.from_env()
    container = client.containers.run(docker_image, ["sleep", "300"], detach=True, labels={"testbed": prefix})
    try:
        shell = ExecShell(client.api, container.id)
        assert shell.script(["echo one"]) == (0, "one\n")
        response = weakref.ref(shell._keep._response.raw)  # the urllib3 response behind the exec
        gc.collect()
        assert response() is not None
        assert shell.script(["echo two"]) == (0, "two\n")
        shell.close()
    finally:
        container.remove(force=True)
        client.close()
    assert labelled(prefix) == []
