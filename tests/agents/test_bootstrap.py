"""The one bootstrap every backend starts commands through, run here as a plain process (no namespace, no
root): what it prepares, the pid it reports, the environment it passes, detaching, and its failure line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from testbed.agents import bootstrap
from testbed.waiting import alive, wait_for

SHOW = "import json, os, sys; print(json.dumps({'pid': os.getpid(), 'cwd': os.getcwd(), 'x': os.environ.get('X'), " \
       "'sid': os.getsid(0), 'stdin': sys.stdin.read()}))"


def run_module(spec: dict, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", bootstrap.MODULE, json.dumps(spec)], capture_output=True, text=True,
                          timeout=30, **kwargs)


def test_it_prepares_the_directories_enters_cwd_adds_env_and_reports_the_pid_it_becomes(tmp_path):
    work = tmp_path / "run"
    spec = {"argv": [sys.executable, "-c", SHOW], "mkdirs": [str(work), str(tmp_path / "out" / "m")],
            "cwd": str(work), "env": {"X": "42"}, "session": True, "pid": True}
    done = run_module(spec)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    shown = json.loads(second)
    assert first == f"pid {shown['pid']}"  # the pid reported is the command's own: exec, not a child
    assert shown["cwd"] == str(work) and shown["x"] == "42" and (tmp_path / "out" / "m").is_dir()
    assert shown["sid"] == shown["pid"]  # the leader of its own session: a group kill takes its children too


def test_from_stdin_its_spec_is_all_stdin_held_and_nothing_of_testbed_need_be_importable(tmp_path):
    spec = {"argv": [sys.executable, "-c", SHOW], "cwd": str(tmp_path), "env": {"X": "secret"}, "pid": True}
    done = subprocess.run([sys.executable, "-I", "-c", bootstrap.source(), "-"], input=json.dumps(spec) + "\nmore\n",
                          capture_output=True, text=True, timeout=30, cwd="/", env={"PATH": os.environ["PATH"]})
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout.splitlines()[1])
    assert shown["x"] == "secret" and shown["stdin"] == ""  # the command reads /dev/null, not the rest


def test_from_stdin_with_stdin_the_command_reads_what_follows_once_its_pid_came(tmp_path):
    """A fork server on an ssh host reads its requests there: sent after "pid N", they all reach the command."""
    spec = {"argv": [sys.executable, "-c", SHOW], "cwd": str(tmp_path), "pid": True, "stdin": True}
    proc = subprocess.Popen([sys.executable, "-I", "-c", bootstrap.source(), "-"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd="/", env={"PATH": os.environ["PATH"]})
    proc.stdin.write(json.dumps(spec) + "\n")
    proc.stdin.flush()
    first = proc.stdout.readline()
    proc.stdin.write("more\n")
    proc.stdin.close()
    shown = json.loads(proc.stdout.readline())
    assert proc.wait(timeout=30) == 0 and first == f"pid {shown['pid']}\n"
    assert shown["stdin"] == "more\n"


def test_with_a_log_the_command_detaches_and_outlives_the_bootstrap(tmp_path):
    log = tmp_path / "out.log"
    spec = {"argv": [sys.executable, "-c", "import os, time; print('sid', os.getsid(0), flush=True); time.sleep(30)"],
            "cwd": str(tmp_path), "log": str(log), "pid": True}
    started = time.monotonic()
    done = run_module(spec)
    assert done.returncode == 0 and time.monotonic() - started < 10, done.stderr
    pid = int(done.stdout.split()[1])
    try:
        assert alive(pid)
        assert wait_for(lambda: "sid" in log.read_text() if log.exists() else False, 10)
        word, sid = log.read_text().split()
        assert word == "sid" and int(sid) not in (os.getsid(0), pid)  # a new session, led by the child that left
    finally:
        os.kill(pid, 9)


def test_a_command_that_cannot_start_is_one_line_and_127():
    done = run_module({"argv": ["/nonexistent/tool", "-x"]})
    assert done.returncode == 127
    assert done.stderr.strip() == "bootstrap: /nonexistent/tool: No such file or directory"
    usage = subprocess.run([sys.executable, "-m", bootstrap.MODULE], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_argv_in_names_the_namespace_for_the_bootstrap():
    argv = bootstrap.argv_in("tb-east-0", ["ping", "-c", "1", "198.18.1.2"])
    assert argv[:3] == [sys.executable, "-m", "testbed.agents.bootstrap"]
    assert json.loads(argv[3]) == {"netns": "tb-east-0", "argv": ["ping", "-c", "1", "198.18.1.2"]}
