"""What crosses to nodes that are not this machine's namespaces (ssh hosts, containers): this package's
sources, and the only environment variables a rank or probe may take along."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from testbed import rankenv

PACKAGE = Path(__file__).resolve().parents[1]
PASS_ENV = (rankenv.PREFIX, "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GLOO_",
            "NCCL_", "OMP_", "PYTHONUNBUFFERED", "TORCH_", "TORCHFT_", "CUDA_VISIBLE_DEVICES")  # TORCHFT_: its lighthouse


def source_archive(top: str = "testbed", compress: bool = True) -> bytes:
    """This package's Python sources as a tar(.gz) with paths under `top`/ (what a node needs to run ranks,
    probes, delay lines and routers)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz" if compress else "w") as tar:
        for path in sorted(PACKAGE.rglob("*.py")):
            tar.add(path, arcname=str(Path(top) / path.relative_to(PACKAGE)))
    return buffer.getvalue()


def pass_env(env: dict[str, str] | None) -> dict[str, str]:
    """The env contract only: never the controller's whole environment."""
    return {key: value for key, value in (env or {}).items() if key.startswith(PASS_ENV)}
