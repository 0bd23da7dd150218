"""The hypervisor's share of this machine's CPU during a cell: /proc/stat parsed, and the share over a window
of the cell's samples (testbed.runner.hostcpu, testbed.collect.frames.host_steal)."""

from __future__ import annotations

import time

import pytest

from testbed.collect.frames import host_steal
from testbed.runner.hostcpu import StealSampler, cpu_times

STAT = """cpu  912972 10188 165144 984968 5222 0 9925 3643 0 0
cpu0 386841 2729 76223 571924 909 0 4855 1847 0 0
cpu1 526130 7459 88920 413044 4312 0 5069 1795 0 0
intr 1 2 3
"""


def test_cpu_times_sum_the_eight_columns_and_take_steal_from_the_aggregate_line():
    assert cpu_times(STAT) == (912972 + 10188 + 165144 + 984968 + 5222 + 0 + 9925 + 3643, 3643)


def test_a_kernel_without_a_steal_column_says_nothing():
    assert cpu_times("cpu  1 2 3 4 5 6 7\n") is None
    assert cpu_times("intr 1 2\n") is None


# samples: (time, all ticks, stolen ticks); 200 ticks a second (two CPUs)
SAMPLES = [[10.0, 1000, 0], [11.0, 1200, 0], [12.0, 1400, 100], [13.0, 1600, 100], [14.0, 1800, 110]]


@pytest.mark.parametrize("start,end,share", [
    (11.0, 13.0, 100 / 400),   # from the sample at 11 to the one at 13
    (11.5, 12.5, 100 / 400),   # widened to the samples around the window: 11 and 13
    (12.0, 14.0, 10 / 400),
    (10.0, 11.0, 0.0),
    (10.0, 14.0, 110 / 800),
])
def test_the_share_stolen_is_taken_between_the_samples_around_the_window(start, end, share):
    assert host_steal({"host_cpu": {"samples": SAMPLES}}, start, end) == pytest.approx(share)


@pytest.mark.parametrize("result", [{}, {"host_cpu": None}, {"host_cpu": {"samples": SAMPLES[1:]}}])
def test_no_share_without_samples_on_both_sides_of_the_window(result):
    assert host_steal(result, 10.5, 12.0) is None  # (the third: nothing at or before 10.5)


def test_the_sampler_reads_a_stat_file_until_stopped(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    sampler = StealSampler(interval=0.01, stat=stat).start()
    time.sleep(0.1)
    record = sampler.stop()
    assert record is not None and record["interval_s"] == 0.01 and len(record["samples"]) >= 3
    assert all(sample[1:] == [cpu_times(STAT)[0], 3643] for sample in record["samples"])
    assert StealSampler(interval=0.01, stat=tmp_path / "missing").start().stop() is None


def test_the_report_names_flagged_cells_and_the_models_error_over_the_others():
    import pandas as pd

    from testbed.collect.report import model_lines, steal_lines

    summary = pd.DataFrame({"cell": ["a", "b", "c", "base"], "status": "ok", "baseline": [False, False, False, True],
                            "step_s_mean": 1.0, "step_s_predicted": [1.1, 1.02, 1.4, 1.0],
                            "step_error": [0.1, 0.02, 0.4, 0.0], "host_steal": [0.0, 0.01, 0.3, float("nan")],
                            "host_steal_flag": [False, False, True, float("nan")]})
    (line,) = steal_lines(summary)
    assert line.startswith("Cell `c`: this machine's hypervisor took 30.0% of its CPU time")
    text = " ".join(model_lines(summary))
    assert "1 of them ran while the hypervisor took over 2%" in text and "over the other 2: median 6.0%" in text
    assert steal_lines(summary.drop(columns=["host_steal", "host_steal_flag"])) == []


def test_a_probe_pair_names_the_steal_during_its_pings_above_the_bound(tmp_path):
    """`testbed probe`'s pairs: the share stolen between two readings, and the pair's words (its table's error
    column and probe.md) only above HOST_STEAL_BOUND."""
    from rich.console import Console

    from testbed.cli.render import probe_table
    from testbed.collect.probe import write_probe_report
    from testbed.runner.hostcpu import HOST_STEAL_BOUND, stolen_share
    from testbed.runner.probe import steal_note

    assert stolen_share((1000, 10), (1400, 30)) == pytest.approx(0.05)
    assert stolen_share(None, (1400, 30)) is None and stolen_share((1400, 30), (1400, 30)) is None
    assert steal_note(None) == "" and steal_note(HOST_STEAL_BOUND) == ""
    assert steal_note(0.083).startswith("the hypervisor took 8.3% of this machine's CPU during these pings")
    base = {"dst": "b", "rtt_configured_ms": 2.0, "rtt_applied_ms": 2.0, "rtt_floor_ms": 0.1, "rtt_floor_of": "path",
            "rtt_dc_floor_ms": 0.05, "rtt_expected_ms": 2.1, "rtt_p10_ms": 2.1, "rtt_p50_ms": 2.4, "rtt_p99_ms": 2.9,
            "rtt_p50_error_ms": 0.3, "loss_configured": 0.0, "ping_loss": 0.0, "rate_configured_mbps": None,
            "goodput_expected_mbps": None, "goodput_mbps": None, "goodput_error": None, "not_applied": ""}
    records = [{**base, "src": "a", "host_steal": 0.083, "host_steal_note": steal_note(0.083)},
               {**base, "src": "c", "host_steal": 0.001, "host_steal_note": steal_note(0.001)}]
    console = Console(width=400, record=True)
    console.print(probe_table(records, {"topology": "t", "shaper": "userspace-delay"}))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if "->" in line}
    assert "+0.300 ms (host steal 8%)" in rows["a -> b"] and "host steal" not in rows["c -> b"]
    text = write_probe_report(tmp_path, {"topology": "t", "shaper": "userspace-delay", "backend": "netns"},
                              records).read_text()
    assert f"- a -> b: {steal_note(0.083)}" in text and "- c -> b:" not in text
