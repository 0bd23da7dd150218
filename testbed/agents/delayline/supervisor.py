"""The delay line's supervisor: run (and re-run) the worker, add the iptables rules once it has bound its
queues, keep a status file, forward SIGHUP (a live `testbed shape`) to the worker.

A direction with nothing to do (no delay, jitter or loss: a 0 ms link) gets no rule: its packets then skip the
delay line's own path (two NFQUEUE passes and two wake-ups a round trip, 0.1-0.3 ms here) that no compensation can
take back. A live change that gives it something to do adds its rule (SIGHUP: the config is read again); one that
leaves it nothing to do deletes it: the quickstart's 0 ms cells, after its 20 ms ones had added the rules, went
through the delay line and were released 0.2-0.3 ms late at p99 (bench/delay_line_under_load.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from testbed.agents.delayline.files import MODULE, DelayLineFiles, DelayLineStatus
from testbed.agents.delayline.worker import KERNEL_LACKS
from testbed.plan.delayline import DelayDirection, load_config
from testbed.waiting import wait_for

BIND_TIMEOUT_S = 10.0


def has_work(item: DelayDirection) -> bool:
    """Whether a direction needs the delay line at all (a rule sending its packets to the queue)."""
    return item.latency > 0 or item.jitter > 0 or item.loss > 0


def _iptables(rule: list[str]) -> str | None:
    """Add one rule; None, or one line saying what is missing (the command, or the kernel's mangle, NFQUEUE or
    dscp match)."""
    try:
        done = subprocess.run(["iptables", "-w", *rule], capture_output=True, text=True)
    except FileNotFoundError:
        return "iptables is not installed (apt-get install iptables)"
    if done.returncode == 0:
        return None
    said = " ".join(done.stderr.split()) or f"exit {done.returncode}"
    return (f"this kernel lacks the mangle table, the NFQUEUE target or the dscp match (iptable_mangle, "
            f"xt_NFQUEUE, xt_dscp): iptables {' '.join(rule[:4])} ... failed: {said}")


def _add_rules(work: list[DelayDirection], status: DelayLineStatus) -> str | None:
    """Add the rule of every direction with work that has none yet (status.rules keeps them); or what failed."""
    for item in work:
        rule = " ".join(item.rule())
        if has_work(item) and rule not in status.rules:
            problem = _iptables(item.rule())
            if problem:
                return problem
            status.rules.append(rule)
    return None


def _drop_rules(work: list[DelayDirection], status: DelayLineStatus) -> str | None:
    """Delete the rule of every direction a live change left with nothing to do (a 0 ms cell after a 20 ms one): its
    packets then skip the delay line's path, as they would had it started so; or what failed. Packets it already
    holds leave when due (those arriving meanwhile may overtake them, as netem's do when its delay falls)."""
    for item in work:
        rule = " ".join(item.rule())
        if not has_work(item) and rule in status.rules:
            delete = item.rule()
            delete[delete.index("-A")] = "-D"
            problem = _iptables(delete)
            if problem:
                return problem
            status.rules.remove(rule)
    return None


def supervise(config_path: str) -> int:
    """Run (and re-run) the worker; set the iptables rules once it is bound; keep a status file."""
    files = DelayLineFiles.of_config(config_path)
    status = DelayLineStatus(supervisor=os.getpid())
    bound = {"flag": False}
    stop = {"flag": False}

    def on_usr1(*_: object) -> None:
        bound["flag"] = True

    def on_term(*_: object) -> None:
        stop["flag"] = True

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    child: subprocess.Popen | None = None

    hup = {"pending": False, "busy": False}

    def on_hup(*_: object) -> None:
        """A live change: the rules of directions that now have work first, then the worker reads its config. Never
        re-entered: a SIGHUP arriving while one is handled (two link faults of one gateway cleared at once) is
        taken by the same call's next round. Entered twice, the inner call's status write renamed the temporary
        file the outer one was about to rename, and the exception killed the supervisor: its links went dark."""
        hup["pending"] = True
        if hup["busy"]:
            return
        hup["busy"] = True
        try:
            while hup["pending"] and status.ready:  # not serving yet: the rules are added from the config then
                hup["pending"] = False
                work = load_config(files.config.read_text())
                problem = _add_rules(work, status) or _drop_rules(work, status)
                if problem:
                    print(f"delayline: {problem}", flush=True)
                status.write(files.status)
                if child is not None:
                    child.send_signal(signal.SIGHUP)
        finally:
            hup["busy"] = False

    signal.signal(signal.SIGHUP, on_hup)
    while not stop["flag"]:
        bound["flag"] = False
        child = subprocess.Popen([sys.executable, "-m", MODULE, "worker", config_path])
        status.worker = child.pid
        wait_for(lambda worker=child: bound["flag"] or worker.poll() is not None, BIND_TIMEOUT_S, interval=0.005)
        if not bound["flag"]:
            if child.poll() != KERNEL_LACKS:  # else the worker said why in one line
                print(f"delayline: worker failed to bind its queues (exit {child.poll()})", flush=True)
            child.kill()
            return 1
        problem = _add_rules(load_config(files.config.read_text()), status)
        if problem:
            print(f"delayline: {problem}", flush=True)
            child.kill()
            return 1
        status.ready = True
        status.write(files.status)
        while child.poll() is None and not stop["flag"]:
            time.sleep(0.05)
            if hup["pending"] and not hup["busy"]:  # one that came as the last round ended
                on_hup()
        if stop["flag"]:
            break
        status.restarts += 1
        print(f"delayline: worker {child.pid} died (exit {child.returncode}); restart {status.restarts}",
              flush=True)
    if child is not None and child.poll() is None:
        child.kill()
    return 0

