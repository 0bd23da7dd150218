"""The delay line's worker: bind the NFQUEUE queues, then hold and release packets until killed.

It hands the kernel a verdict for packets it drops (loss) and batch verdicts for the ones due (release.py
decides which); it wakes shortly before the head of a queue is due. SCHED_FIFO unless $TESTBED_DELAY_LINE_RT is
0: busy ranks on the same cores otherwise delay its releases by milliseconds (bench/delay_line_priority.py).
Its figures go to the stats file from a thread of their own: the release loop never waits for a file system.

It aims each packet before its due time by its own path's time (release.py), measured at start (the same wait and
a verdict that accepts nothing, STARTUP_TRIES times) and then on every packet it waited for; $TESTBED_DELAY_LINE_COMPENSATE
set to 0 aims at the due time itself (bench/link_fidelity.py compares both).

Fewer wake-ups per packet: while a packet waits and nothing that arrives before it is aimed could be due before it
(every packet is held at least latency - jitter; FIFO), the worker sleeps without watching the queue and reads what
came meanwhile when it wakes for the head, in one batch: one wake-up a packet instead of two under steady traffic.
Nor does it read at every wake-up: what arrived since the last read is held at least that long too, so a read
waits for a wake-up past half that time, after that wake-up's verdict (or ends a sleep at the latest moment, and
comes first): many packets a read, one system call for up to nfqueue.READ_SLOTS of them, where it took a read per
wake-up and two recv() a packet (one finding the queue empty). $TESTBED_DELAY_LINE_BATCH set to 0 watches the queue
all the time and reads it at every wake-up (bench/link_fidelity.py compares both, and with --before the code of an
earlier revision). A read that can wait takes CHUNK packets at a time and releases what is due before the next bite:
under the quickstart's training a burst read at once (up to 199 packets) held the loop for up to 1.5 ms
(bench/delay_line_under_load.py); one that must come first reads all.

A verdict after a sleep is slow: its code, Python's and the kernel's, has gone cold, and the packet left the
gateway 18 us after its due time where an unshaped gateway crossing takes 3 (bench/delay_line_path.py, the kernel's
trace). So once a sleep has brought the loop within EARLY_WAKE of a release, it first sends a verdict that accepts
nothing, 20-40 us before the real one: the packet then leaves 9 us after its due time. That holds whichever deadline
ended the sleep: with a 2 ms hold, the sleep ends at the read's deadline, 160 us before the head's wake-up less the
worker's reaction to the arrival, and on a VM's late timers past it (it warmed 3 of 20 pings in CI, 2026-12-02,
when only a sleep aimed at the wake-up did). $TESTBED_DELAY_LINE_WARM set to 0 does not."""

from __future__ import annotations

import ctypes
import json
import os
import random
import select
import signal
import statistics
import time

from testbed import settings
from testbed.agents.delayline.files import DelayLineFiles
from testbed.agents.delayline.nfqueue import NF_DROP, QueueSocket
from testbed.agents.delayline.release import Direction
from testbed.agents.realtime import fifo
from testbed.atomic import LatestWriter
from testbed.plan.delayline import load_config

EARLY_WAKE = 40e-6  # wake this much before the head is due
RELEASE_SLACK = 20e-6  # release what is due within this much
MAX_SLEEP = 0.002
KERNEL_LACKS = 3  # the worker's exit status when the kernel has no nfnetlink_queue (it printed why)
RT_ENV, RT_PRIORITY = settings.DELAY_LINE_RT, 10
STATS_EVERY = 1.0  # seconds between stats files while packets flow (and on request, SIGUSR2)
COMPENSATE_ENV = settings.DELAY_LINE_COMPENSATE
BATCH_ENV = settings.DELAY_LINE_BATCH
WARM_ENV = settings.DELAY_LINE_WARM
UNWATCHED_MARGIN = 200e-6  # an unwatched sleep ends at least this long before a new arrival could be due
READ_SHARE = 0.5  # a read comes with the first wake-up after this share of the time it may be put off
STARTUP_TRIES, STARTUP_AHEAD = 31, 300e-6  # the path measured at start: tries, and how far ahead each aims
CHUNK = 32  # packets a read that can wait takes at most before the loop releases what is due (~1 us a packet)
MARGIN_SAMPLES, MARGIN_MOST = 32, 300e-6  # oversleeps a wake-up margin is learnt from; the most it aims early


class WakeMargin:
    """How late this host's timed sleeps end past their aim: the worker's sleeps aim that much earlier, so that it
    wakes before the head is due (then spins, and warms the verdict's path) rather than after it. On this project's
    2-core VM the worker's 1.5 ms sleeps ended 90-230 us late under SCHED_FIFO (2026-12-02), each release as late;
    bare metal a few us. The 75th percentile of the last MARGIN_SAMPLES sleeps that ran to their end, at most
    MARGIN_MOST (the spin it costs a packet)."""

    def __init__(self) -> None:
        self.recent: list[float] = []
        self.seconds = 0.0

    def record(self, late: float) -> None:
        self.recent.append(max(0.0, late))
        if len(self.recent) == MARGIN_SAMPLES:
            self.seconds = min(sorted(self.recent)[int(0.75 * MARGIN_SAMPLES)], MARGIN_MOST)
            self.recent.clear()


def _stats_text(by_key: dict[str, Direction], sched: str, margin: WakeMargin) -> str:
    cpu = time.process_time()  # the worker's CPU seconds so far, user and system (the kernel carrying units on)
    return json.dumps({"worker": os.getpid(), "written": time.time(), "directions": {
        key: {"worker": os.getpid(), "scheduling": sched, "released": line.released, "warmed": line.warmed,
              "woke_late": line.woke_late, "cold": line.cold, "late": line.late, "worker_cpu_s": cpu,
              "wake_margin_ms": margin.seconds * 1e3, **line.figures()}
        for key, line in by_key.items()}})


def soonest(directions: dict[int, Direction]) -> float:
    """The least time after its arrival that any packet of these directions can be aimed at (seconds); a direction
    with nothing to do has no rule and gets no packet (supervisor.has_work)."""
    holds = [line.latency - line.jitter - max(0.0, line.compensation) if line.compensate else line.latency - line.jitter
             for line in directions.values() if line.latency > 0 or line.jitter > 0 or line.loss > 0]
    return min(holds, default=float("inf"))


def read_times(now: float, hold: float) -> tuple[float, float]:
    """After a read of the queue at `now`, when every packet still unread is held at least `hold` (soonest()): from
    when the next read may come with a wake-up for a release, and by when it must come (an unread packet could be
    aimed at UNWATCHED_MARGIN after it). A hold below the margin: read at every wake-up, and sleep watching."""
    room = hold - UNWATCHED_MARGIN
    if room <= 0:
        return now, now
    return now + READ_SHARE * room, now + room


def take(sock: QueueSocket, directions: dict[int, Direction], now: float, watched: bool, most: int = 4096) -> bool:
    """Read what is queued (up to `most` packets) and admit it, each packet its direction's (a drop verdict for each
    one lost); after a watched sleep, the first packet samples the worker's reaction (one sample a read: cheap under
    load). Whether the queue may hold more (the read stopped at `most`)."""
    packets = sock.receive(most)
    for queue, packet_id, stamp in packets:
        line = directions.get(queue)
        if line is None:
            continue
        if not line.admit(packet_id, now if stamp is None else stamp, now):
            sock.verdict(queue, packet_id, NF_DROP)
    if watched and packets and packets[0].queue in directions and packets[0].timestamp is not None:
        directions[packets[0].queue].saw(packets[0].timestamp, now)
    return sock.more


def warm_up(sock: QueueSocket, line: Direction) -> float:
    """A verdict that accepts nothing on `line`'s queue (the kernel's answer is read and skipped), so that the
    release after a sleep finds its path warm; counted; returns the head's aim it was for."""
    sock.accept_up_to(line.queue, line.before_head())
    line.warmed += 1
    aim = line.next_due()
    assert aim is not None
    return aim


def wait_until(aim: float, margin: WakeMargin) -> float:
    """Sleep, then spin, until `aim` is within RELEASE_SLACK (as the release loop waits; each sleep's lateness
    goes to `margin`); returns the time."""
    while True:
        now = time.time()
        if aim <= now + RELEASE_SLACK:
            return now
        timeout = min(aim - now - EARLY_WAKE - margin.seconds, MAX_SLEEP)
        if timeout > 0:
            select.select([], [], [], timeout)
            margin.record(time.time() - now - timeout)


def startup_path(sock: QueueSocket, queue: int, margin: WakeMargin) -> float:
    """The path's time measured before any packet: wait for an aim as the release loop does and send a verdict that
    accepts nothing (packet ids start at 1); the median of (when the verdict came back - aim), seconds."""
    times = []
    for _ in range(STARTUP_TRIES):
        aim = time.time() + STARTUP_AHEAD
        wait_until(aim, margin)
        sock.accept_up_to(queue, 0)
        times.append(time.time() - aim)
    sock.receive()  # the kernel's answers (no such packet) are not packets: drained, skipped
    return statistics.median(times)


def worker(config_path: str) -> int:
    """Bind the queues, then hold and release packets until killed."""
    libc = ctypes.CDLL(None)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the supervisor
    libc.prctl(29, 1)  # PR_SET_TIMERSLACK: 1 ns, so short sleeps end on time
    files = DelayLineFiles.of_config(config_path)
    work = load_config(files.config.read_text())
    try:
        sock = QueueSocket(timestamps=True)
        for item in work:
            sock.bind(item.queue, item.limit, gso=item.loss == 0)
    except OSError as error:
        print(f"delayline: this kernel lacks nfnetlink_queue (NFQUEUE): binding a queue failed "
              f"({error.strerror or error})", flush=True)
        return KERNEL_LACKS
    sched = fifo(RT_ENV, RT_PRIORITY)  # the figures say what ran
    rng = random.Random()
    compensate = settings.switched_on(COMPENSATE_ENV)
    margin = WakeMargin()  # learnt at start (the path's measurement sleeps too) and on
    start = startup_path(sock, work[0].queue, margin) if work and compensate else 0.0
    directions = {item.queue: Direction(item.queue, item.latency, item.jitter, item.loss, rng, start)
                  for item in work}
    for line in directions.values():
        line.compensate = compensate
    by_key = {item.key: directions[item.queue] for item in work}
    asked = {"stats"}  # what signals asked for: "reload" (the config), "stats" (a runner wants the figures now)
    signal.signal(signal.SIGHUP, lambda *_: asked.add("reload"))
    signal.signal(signal.SIGUSR2, lambda *_: asked.add("stats"))
    print(json.dumps({"worker": os.getpid(), "bound": sorted(directions), "scheduling": sched}), flush=True)
    os.kill(os.getppid(), signal.SIGUSR1)  # tell the supervisor the queues are bound
    next_stats, written = time.time() + STATS_EVERY, -1
    # the release loop never waits for the file system: when it wrote the stats itself, a busy disk held the packets
    # due meanwhile (a cell's delay line was late by 95 ms at most, its probe's p99 194 ms on a 40 ms round trip)
    stats = LatestWriter(files.stats, name="stats")
    batch = settings.switched_on(BATCH_ENV)
    warm = settings.switched_on(WARM_ENV)
    lines = list(directions.values())
    watched = True  # whether the last sleep watched the queue (so a read's first packet samples the reaction)
    read_after = read_by = 0.0  # when the next read may come with a release's wake-up, and when it must come
    slept, warmed_for = False, 0.0  # whether the loop slept since its last release; the head's due time it warmed for
    woke_at = 0.0  # when the last sleep ended
    while True:
        now = time.time()
        if asked or now > next_stats:  # one test a wake-up while nothing is asked and no figures are due
            if "reload" in asked:
                asked.discard("reload")
                for item in load_config(files.config.read_text()):
                    if item.queue in directions:
                        directions[item.queue].configure(item.latency, item.jitter, item.loss)
                read_after = read_by = 0.0  # the holds changed: read now, and plan the next read anew
            if "stats" in asked or (now > next_stats and sum(x.released for x in lines) != written):
                asked.discard("stats")
                written = sum(x.released for x in lines)
                stats.submit(_stats_text(by_key, sched, margin))
            next_stats = now + STATS_EVERY
        first = watched or now >= read_by  # a packet not read yet could be due: read before releasing
        if first:
            take(sock, directions, now, watched)
            read_after, read_by = read_times(now, soonest(directions) if batch else 0.0)
            now = time.time()
        for line in lines:
            aim = line.next_due()
            if (warm and slept and aim is not None and aim <= now + RELEASE_SLACK and warmed_for != aim
                    and woke_at < aim - RELEASE_SLACK):  # the sleep ended in time but the loop, spinning, went
                # past the warm-up's window (an iteration longer than it: a read, a preemption): warm it now
                warmed_for = warm_up(sock, line)
            last = line.release(now, RELEASE_SLACK)
            if last is not None:
                sent = time.time()
                sock.accept_up_to(line.queue, last)
                line.settle(sent, time.time())
                if slept and warmed_for != aim:  # a release after a sleep that no warm-up preceded: the sleep
                    if woke_at >= aim - RELEASE_SLACK:  # ended past the head's aim (the host's timer), or
                        line.woke_late += 1
                    else:  # had time to warm it and did not (the worker's own miss)
                        line.cold += 1
                slept = False
        if not first and now >= read_after:  # a read that can wait comes after the verdicts, off their packets' way,
            # and in CHUNK-sized bites, a release between two (a burst read at once held the loop for up to 1.5 ms);
            # until one empties the queue, what is unread arrived after the last read that did (read_by holds)
            if take(sock, directions, now, False, CHUNK):
                read_after = now
            else:
                read_after, read_by = read_times(now, soonest(directions))
        wake = head = None
        for line in lines:
            due = line.next_due()
            if due is not None and (wake is None or due < wake):
                wake, head = due, line.queue
        # select(), not poll(): poll rounds its timeout up to whole milliseconds.
        now = time.time()
        if wake is None:
            watched = slept = True
            select.select([sock], [], [], 0.2)
            woke_at = time.time()
            continue
        if warm and slept and warmed_for != wake and wake - EARLY_WAKE <= now < wake:
            # a sleep (whichever deadline ended it: the head's wake-up, or a read's that fell inside the head's
            # window) brought the loop to a release: the verdict's path, cold after it, is warmed once for that head
            # (not at every arrival a watched sleep ends on, nor while packets flow without a sleep)
            warmed_for = warm_up(sock, directions[head])
            continue
        end = min(wake - EARLY_WAKE - margin.seconds, now + MAX_SLEEP)
        watched = read_by <= now
        if not watched:
            end = min(end, read_by - margin.seconds)
        if end <= now:
            continue
        slept = True
        if watched:
            ready = select.select([sock], [], [], end - now)[0]
            woke_at = time.time()
            if not ready:  # ran to its end (not ended by an arrival)
                margin.record(woke_at - end)
        else:
            time.sleep(end - now)  # cheaper than an empty select(), as precise (timer slack 1 ns)
            woke_at = time.time()
            margin.record(woke_at - end)
