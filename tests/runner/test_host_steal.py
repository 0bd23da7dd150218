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
