"""The Prolog and Epilog an admin installs (`testbed slurm prolog|epilog`, or `python -m testbed.fabric.slurm.prolog
prolog|epilog`): root on each allocated node at the job's start and end.

A job that testbed submitted carries the comment `testbed:PREFIX:PLANFILE`. The Prolog reads that plan (it must
belong to the job's user or root), derives this node's shaping from it (testbed.fabric.slurm.node.apply: never a
command from the file) and writes what it did, or why it could not, to the node's run directory (prolog.json) for the
job to read; it exits 0 either way, so that a bad plan never drains a node. The Epilog undoes testbed's changes of
PREFIX on this node whatever happened to the job (node.restore), plan file or not. Any other job: nothing is done."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from testbed.fabric.slurm.cluster import parse_job
from testbed.fabric.slurm.jobplan import COMMENT_TAG, JobPlan
from testbed.fabric.slurm.node import NodeError, apply, dirs_of, node_name, restore

RESULT = "prolog.json"


def job_comment(job_id: str) -> tuple[str, str, int | None] | None:
    """(prefix, plan file, job's uid) of a testbed job, None for any other."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    job = parse_job(out.stdout)
    if not job.comment.startswith(COMMENT_TAG):
        return None
    prefix, _, path = job.comment[len(COMMENT_TAG):].partition(":")
    return (prefix, path, job.user_id) if prefix and path else None


def _write_result(prefix: str, result: dict, uid: int | None) -> None:
    workdir, _ = dirs_of(prefix, node_name())
    os.makedirs(workdir, exist_ok=True)
    path = Path(workdir) / RESULT
    path.write_text(json.dumps(result))
    if uid is not None:
        os.chown(path, uid, -1)


def prolog(job_id: str, uid: int | None, gid: int | None) -> dict | None:
    found = job_comment(job_id)
    if found is None:
        return None
    prefix, path, owner = found
    try:
        stat = os.stat(path)
        if stat.st_uid not in (0, owner if owner is not None else uid):
            raise NodeError(f"{path}: owned by uid {stat.st_uid}, not the job's user")
        plan = JobPlan.load(Path(path).read_text())
        if plan.root != "prolog":
            return None  # the job shapes its nodes itself (sudo -n); the Epilog still restores them
        result = {"ok": True, **apply(path, uid, gid)}
    except (NodeError, OSError, KeyError, ValueError) as error:
        result = {"ok": False, "error": str(error)}
    _write_result(prefix, result, uid)
    return result


def epilog(job_id: str) -> dict | None:
    found = job_comment(job_id)
    if found is None:
        return None
    prefix = found[0]
    return restore(prefix, list(dirs_of(prefix, node_name())))


def main(argv: list[str]) -> int:
    """`prolog` or `epilog`, with the environment slurmd gives them (SLURM_JOB_ID, SLURM_JOB_UID, ...)."""
    if argv not in (["prolog"], ["epilog"]):
        print("usage: python -m testbed.fabric.slurm.prolog prolog|epilog (as the site's Prolog/Epilog)",
              file=sys.stderr)
        return 2
    job_id = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
    if not job_id:
        print("testbed slurm: no SLURM_JOB_ID (run as slurmd's Prolog or Epilog)", file=sys.stderr)
        return 2
    uid = os.environ.get("SLURM_JOB_UID")
    gid = os.environ.get("SLURM_JOB_GID")
    try:
        if argv[0] == "prolog":
            result = prolog(job_id, int(uid) if uid else None, int(gid) if gid else None)
        else:
            result = epilog(job_id)
    except (NodeError, OSError) as error:  # the Epilog: said, and the node is left for `testbed clean`
        print(f"testbed slurm {argv[0]}: {error}", file=sys.stderr)
        return 0
    if result is not None:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
