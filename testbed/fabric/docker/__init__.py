"""The docker backend: nodes and DC routers as containers on a docker engine (or adopted from docker compose)."""

from testbed.fabric.docker.backend import DockerBackend

__all__ = ["DockerBackend"]
