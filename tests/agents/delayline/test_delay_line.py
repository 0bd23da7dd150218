"""The userspace delay line's release logic as a pure function: due times, the jitter law, FIFO order, loss, the
compensation of its own path and the residual figures it keeps (no kernel, no root)."""

from __future__ import annotations

import random
import statistics

import pytest

from testbed.agents.delayline.release import LATE_BUCKET, Direction, lateness_delta, lateness_summary


def test_every_packet_is_due_its_latency_after_it_arrived():
    line = Direction(0, 0.010, 0.0, 0.0, random.Random(1))
    for packet, arrival in enumerate([100.0, 100.001, 100.5]):
        assert line.admit(packet, arrival)
    assert [due for _, due, _, _ in line.fifo] == pytest.approx([100.010, 100.011, 100.510])
    assert line.release(100.0105) == 0  # only the first is due
    assert line.release(100.0112) == 1 and line.next_due() == pytest.approx(100.510)
    assert line.release(100.2) is None


@pytest.mark.parametrize(("first", "below"), [(1, 0), (2**31 + 5, 2**31 + 4), (0, 2**32 - 1)])
def test_a_verdict_that_accepts_nothing_names_the_id_just_below_the_head(first, below):
    """The kernel accepts every held id that is not after the verdict's, modulo 2**32: one below the head is
    before every held packet, where 0 would be after those from 2**31 on and accept them."""
    line = Direction(0, 0.010, 0.0, 0.0, random.Random(1))
    for offset, arrival in enumerate([100.0, 100.001]):
        line.admit((first + offset) & 0xFFFFFFFF, arrival)
    assert line.before_head() == below
    assert line.release(100.0105) == first  # the head moves on to the next packet
    assert line.before_head() == first


def test_jitter_is_uniform_and_never_reorders():
    line = Direction(0, 0.020, 0.005, 0.0, random.Random(7))
    arrivals = [i * 0.05 for i in range(4000)]  # far apart: order never binds, the law shows as drawn
    for packet, arrival in enumerate(arrivals):
        line.admit(packet, arrival)
    delays = [due - arrival for (_, due, _, _), arrival in zip(line.fifo, arrivals)]
    assert 0.015 <= min(delays) and max(delays) <= 0.025
    assert statistics.mean(delays) == pytest.approx(0.020, abs=0.0002)
    assert statistics.pstdev(delays) == pytest.approx(0.005 / 3**0.5, rel=0.03)

    close = Direction(0, 0.020, 0.010, 0.0, random.Random(7))
    for packet in range(2000):  # 0.1 ms apart with 10 ms of jitter: without the FIFO clamp they would cross
        close.admit(packet, packet * 0.0001)
    dues = [due for _, due, _, _ in close.fifo]
    assert dues == sorted(dues)


def test_loss_drops_that_share_independently():
    line = Direction(0, 0.001, 0.0, 0.02, random.Random(3))
    kept = sum(line.admit(packet, packet * 1e-3) for packet in range(20000))
    assert 1 - kept / 20000 == pytest.approx(0.02, abs=0.003)
    assert len(line.fifo) == kept


def test_release_records_how_late_each_packet_left():
    line = Direction(0, 0.010, 0.0, 0.0, random.Random(1))
    for packet in range(100):
        line.admit(packet, 0.0)  # all due at 10 ms
    assert line.release(0.0125, slack=20e-6) == 99  # released 2.5 ms late
    assert line.released == 100
    assert lateness_summary(line.late) == {"packets": 100, "p50_ms": pytest.approx(2.5), "p99_ms": pytest.approx(2.5),
                                           "max_ms": pytest.approx(2.5)}
    early = Direction(0, 0.010, 0.0, 0.0, random.Random(1))
    early.admit(0, 0.0)
    assert early.release(0.00999, slack=20e-6) == 0  # within the slack: released 10 us early
    assert early.late == {-1: 1}


def test_it_aims_early_by_its_measured_path_and_the_residual_comes_to_zero():
    """A simulated worker whose verdicts come back 150 us after it sends them (its wake-up and the kernel's
    re-injection): without compensation every packet leaves 150 us late; with it, after the first samples, on time."""
    path = 150e-6

    def run(compensate: bool) -> Direction:
        line = Direction(0, 0.003, 0.0, 0.0, random.Random(1))
        line.compensate = compensate
        for packet in range(200):
            arrival = packet * 0.005
            line.admit(packet, arrival, seen=arrival + 20e-6)
            aim = line.next_due()
            assert line.release(aim + path) == packet  # the worker gets to it `path` after its aim
            line.settle(aim + path, aim + path)
        return line

    late = run(False)
    assert lateness_summary(late.late)["p50_ms"] == pytest.approx(0.15)
    assert late.figures()["path_ms"] == pytest.approx(0.15) and late.figures()["compensation_ms"] == 0.0
    aimed = run(True)
    assert aimed.compensation == pytest.approx(path)
    residual = lateness_summary(aimed.late)
    assert residual["p50_ms"] == pytest.approx(0.0) and residual["packets"] == 200


def test_what_the_verdict_call_carries_on_is_not_taken_back():
    """The verdict call re-injects the packet and carries it on through the peer's stack, which the unshaped path
    does too: only the worker's lateness from its aim to the verdict (here 60 us) is compensated, never the call's
    100 us, so no packet leaves before its due time plus what the unshaped path takes."""
    line = Direction(0, 0.003, 0.0, 0.0, random.Random(1))
    for packet in range(200):
        arrival = packet * 0.005
        line.admit(packet, arrival, seen=arrival + 20e-6)
        aim = line.next_due()
        assert line.release(aim + 60e-6) == packet
        line.settle(aim + 60e-6, aim + 160e-6)
    assert line.compensation == pytest.approx(60e-6)
    assert lateness_summary(line.late)["p50_ms"] >= 0.0  # never early


def test_packets_it_could_not_wait_for_do_not_move_the_compensation():
    """A 0 ms link: every packet is due before the worker sees it; sampling those would push the aim ever earlier."""
    line = Direction(0, 0.0, 0.0, 0.0, random.Random(1))
    for packet in range(100):
        arrival = packet * 0.005
        line.admit(packet, arrival, seen=arrival + 80e-6)
        line.saw(arrival, arrival + 80e-6)
        line.release(arrival + 90e-6)
        line.settle(arrival + 90e-6, arrival + 100e-6)
    assert line.compensation == 0.0 and not line.path
    assert line.least() == pytest.approx(80e-6)
    assert line.verdict == pytest.approx(10e-6, rel=0.01)  # the verdict call's running time: 10 us every time
    assert lateness_summary(line.late)["p50_ms"] == pytest.approx(0.09, abs=0.011)  # released at 90 us (+ verdict)


def test_lateness_summary_and_delta():
    late = {str(b): 1 for b in range(100)}  # 0 .. 0.99 ms, one packet each (JSON keys are strings)
    summary = lateness_summary(late)
    assert summary["packets"] == 100
    assert summary["p50_ms"] == pytest.approx(49 * LATE_BUCKET * 1e3)
    assert summary["p99_ms"] == pytest.approx(98 * LATE_BUCKET * 1e3)
    assert summary["max_ms"] == pytest.approx(99 * LATE_BUCKET * 1e3)
    assert lateness_summary({}) == {"packets": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    before = {"worker": 5, "late": {"0": 10, "3": 2}}
    after = {"worker": 5, "late": {"0": 15, "3": 2, "9": 1}}
    assert lateness_delta(before, after) == {"0": 5, "9": 1}
    assert lateness_delta(before, {"worker": 6, "late": {"0": 4}}) == {"0": 4}  # a restarted worker starts again


def test_the_worker_sleeps_unwatched_only_as_long_as_no_new_packet_could_be_due():
    """A new arrival is held at least latency - jitter (less the compensation): the worker may sleep that long
    without reading its queue; a direction with nothing to do (no rule, no packets) does not shorten it."""
    from testbed.agents.delayline.worker import soonest

    rng = random.Random(1)
    slow, jittery, idle = (Direction(0, 0.020, 0.0, 0.0, rng), Direction(1, 0.005, 0.002, 0.0, rng),
                           Direction(2, 0.0, 0.0, 0.0, rng))
    jittery.compensation = 0.0001
    assert soonest({0: slow, 2: idle}) == pytest.approx(0.020)
    assert soonest({0: slow, 1: jittery, 2: idle}) == pytest.approx(0.005 - 0.002 - 0.0001)
    assert soonest({2: idle}) == float("inf")
    assert soonest({3: Direction(3, 0.0, 0.0, 0.01, rng)}) == 0.0  # loss alone: queued, due at once


def test_the_worker_reads_its_queue_by_the_time_an_unread_packet_could_be_due():
    """After a read at `now`, what is still unread is held at least `hold`: the next read may wait for a wake-up
    past half of that (less the margin), and must come by all of it; a hold within the margin: read every time."""
    from testbed.agents.delayline.worker import READ_SHARE, UNWATCHED_MARGIN, read_times

    after, by = read_times(100.0, 0.005)
    assert by == pytest.approx(100.0 + 0.005 - UNWATCHED_MARGIN)
    assert after == pytest.approx(100.0 + READ_SHARE * (0.005 - UNWATCHED_MARGIN)) and 100.0 < after < by
    assert read_times(100.0, UNWATCHED_MARGIN / 2) == (100.0, 100.0)
    assert read_times(100.0, float("inf"))[1] == float("inf")  # nothing queued anywhere: no read is due


def test_the_compensation_is_the_median_of_the_recent_path_samples():
    """Kept in order as samples come and go (no sort per estimate): the same figure as statistics.median of the
    last SAMPLES, duplicates and evictions included, at every estimate (each sample at first, then every
    REESTIMATE_EVERY samples)."""
    from testbed.agents.delayline.release import REESTIMATE_EVERY, SAMPLES

    line = Direction(0, 0.005, 0.0, 0.0, random.Random(1))
    draw = random.Random(5)
    estimates = 0
    for count in range(3 * SAMPLES):
        before = line.compensation
        line._sample(2e-5 if count % 10 == 0 else draw.uniform(0, 1e-4))  # a few equal ones too
        if line._fresh == 0:
            estimates += 1
            assert line.compensation == statistics.median(line.path), count
        else:
            assert line.compensation == before
    assert len(line.path) == SAMPLES and estimates >= 3 * SAMPLES // REESTIMATE_EVERY
