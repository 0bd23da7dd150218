"""The host's ARP limits: raised for a testbed that needs more, restored when the last such testbed is gone
(against a stand-in /proc directory: no root, the host untouched)."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.fabric.netns.neighbours import (
    ensure_neighbour_capacity,
    neighbour_entries,
    release_neighbour_capacity,
)


@pytest.fixture
def neigh(tmp_path: Path) -> Path:
    proc = tmp_path / "neigh"
    proc.mkdir()
    (proc / "gc_thresh2").write_text("512\n")
    (proc / "gc_thresh3").write_text("1024\n")
    return proc


def limits(neigh: Path) -> tuple[int, int]:
    return int((neigh / "gc_thresh2").read_text()), int((neigh / "gc_thresh3").read_text())


def test_entries_count_every_node_and_gateway_of_a_dc_and_both_ends_of_a_link():
    assert neighbour_entries([2, 2], 1) == 3 * 2 + 3 * 2 + 2
    assert neighbour_entries([32] * 4, 6) == 4 * 33 * 32 + 12


def test_a_small_testbed_changes_nothing(neigh, tmp_path):
    record = tmp_path / "record.json"
    assert ensure_neighbour_capacity(294, "tb-a-", neigh=neigh, record=record) is None
    assert limits(neigh) == (512, 1024) and not record.exists()
    assert release_neighbour_capacity("tb-a-", neigh=neigh, record=record) is None


def test_limits_come_back_when_the_last_testbed_that_needed_them_is_down(neigh, tmp_path):
    record = tmp_path / "record.json"
    said = ensure_neighbour_capacity(4300, "tb-big-", neigh=neigh, record=record)
    assert said and "1024 to 8600" in said and limits(neigh) == (4300, 8600)
    assert ensure_neighbour_capacity(1000, "tb-mid-", neigh=neigh, record=record) is None  # needs it too
    assert ensure_neighbour_capacity(100, "tb-small-", neigh=neigh, record=record) is None  # does not
    assert release_neighbour_capacity("tb-big-", neigh=neigh, record=record) is None
    assert limits(neigh) == (4300, 8600)  # tb-mid- still needs more than 1024
    assert release_neighbour_capacity("tb-small-", neigh=neigh, record=record) is None
    assert "to 1024" in release_neighbour_capacity("tb-mid-", neigh=neigh, record=record)
    assert limits(neigh) == (512, 1024) and not record.exists()


def test_a_second_raise_keeps_the_first_original(neigh, tmp_path):
    record = tmp_path / "record.json"
    ensure_neighbour_capacity(1000, "tb-a-", neigh=neigh, record=record)
    ensure_neighbour_capacity(3000, "tb-b-", neigh=neigh, record=record)
    assert limits(neigh) == (3000, 6000)
    release_neighbour_capacity("tb-b-", neigh=neigh, record=record)
    release_neighbour_capacity("tb-a-", neigh=neigh, record=record)
    assert limits(neigh) == (512, 1024)


def test_limits_someone_else_changed_since_are_left_alone(neigh, tmp_path):
    record = tmp_path / "record.json"
    ensure_neighbour_capacity(4300, "tb-big-", neigh=neigh, record=record)
    (neigh / "gc_thresh3").write_text("16384\n")
    assert release_neighbour_capacity("tb-big-", neigh=neigh, record=record) is None
    assert limits(neigh) == (4300, 16384) and not record.exists()
