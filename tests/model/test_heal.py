"""testbed.model.heal: a torchft heal's fetch of a healthy group's state and its whole heal_s, and the runner's
prediction beside the measured heal."""

from __future__ import annotations

import pytest

from testbed.model.heal import predict_fetch, predict_heal
from testbed.model.transport import Transport
from testbed.runner.replicas import predict_heals
from testbed.spec.link import LinkParams
from testbed.spec.loader import validate_data
from testbed.spec.topology import Topology

STATE = 19.2e6  # bytes: the small preset's model and AdamW's two moments would be 3x this


def test_a_large_state_over_a_shaped_link_takes_its_size_over_the_payload_rate_and_the_difference_of_two_rates():
    t = Transport()
    slow, fast = (predict_fetch(STATE, 0.005, 0.005, rate, t) for rate in (100e6, 200e6))
    payload = STATE * 8 / t.efficiency
    assert slow.transfer_s == pytest.approx(payload / 100e6, rel=0.05)
    # what two rates differ by is the state over the rates, nothing else (the handshake and copies are the same)
    assert slow.total_s - fast.total_s == pytest.approx(payload / 100e6 - payload / 200e6, rel=0.05)
    assert slow.handshake_s == pytest.approx(0.015) and slow.copies_s == fast.copies_s


def test_slow_start_costs_round_trips_a_long_path_shows():
    t = Transport()
    near, far = (predict_fetch(1e6, one_way, one_way, 10e9, t) for one_way in (0.001, 0.020))
    # windows of 10, 20, ..., 320 segments (912 KB) each wait for their round trip's acknowledgements, then the rest
    window, rounds, sent = t.initial_window * t.mss, 0, 0.0
    while sent + window < 1e6:
        sent, window, rounds = sent + window, 2 * window, rounds + 1
    assert rounds == 6 and far.transfer_s == pytest.approx(rounds * 0.040 + 0.020, abs=0.001)
    assert far.transfer_s > 5 * near.transfer_s


def test_the_runner_puts_the_prediction_beside_each_heal_from_the_healthy_groups_dc():
    topology = validate_data(Topology, {"name": "three", "dcs": [{"name": "east", "nodes": 1}, {"name": "west", "nodes": 1},
                                                                 {"name": "north", "nodes": 1}],
                                        "links": [{"between": ["east", "west"], "latency": "5ms", "bandwidth": "1gbit"},
                                                  {"between": ["west", "north"], "latency": "20ms",
                                                   "bandwidth": "100mbit"}]}, "t.yaml")
    links = {key: LinkParams(latency=0.005, bandwidth=1e9) for key in ("east->west", "west->east")}
    links |= {key: LinkParams(latency=0.020, bandwidth=100e6) for key in ("west->north", "north->west")}
    figures = {"heals": [{"rank": 2, "healed_bytes": STATE, "healed_from": "198.18.0.10"},
                         {"rank": 2, "healed_bytes": STATE, "healed_from": "198.18.1.10"},
                         {"rank": 1, "healed_bytes": 0, "healed_from": None}]}
    predict_heals(figures, topology, links, {"198.18.0.10": "east", "198.18.1.10": "west"},
                  ["east", "west", "north"], Transport(), calibrated=False, options={})
    via_west, direct = figures["heals"][0], figures["heals"][1]
    # east -> north is routed over west: 25 ms one way, the narrowest hop's 100 Mbit/s
    assert via_west["healed_from_dc"] == "east" and via_west["fetch_predicted"]["handshake_s"] == pytest.approx(0.075)
    assert direct["fetch_predicted"]["handshake_s"] == pytest.approx(0.060)
    assert via_west["fetch_predicted_s"] > direct["fetch_predicted_s"] > STATE * 8 / 100e6
    assert via_west["fetch_transport"] == "first guesses"
    assert "fetch_predicted_s" not in figures["heals"][2]  # nothing fetched, nothing predicted

    assert "heal_predicted_s" not in via_west  # no survivor's pace, setup or kill time: no whole heal predicted


def test_a_group_back_after_the_heartbeat_lapsed_waits_for_the_survivors_next_quorum_anywhere_in_their_period():
    fetch = predict_fetch(STATE, 0.005, 0.005, 100e6, Transport())
    heal = predict_heal(fetch, setup_s=1.5, before_quorum_s=0.8, quorum_period_s=1.2, rest_s=0.3, reconfigure_s=0.2,
                        asked_after_kill_s=4.0, heartbeat_timeout_s=1.0, join_timeout_s=1.0, lighthouse_rtt_s=0.01)
    assert not heal.survivors_waiting
    assert (heal.wait_low_s, heal.wait_high_s) == pytest.approx((0.01, 1.21))
    assert heal.quorum_wait_s == pytest.approx(0.61)  # the middle of the period, and the lighthouse's answer
    assert heal.total_s == pytest.approx(1.5 + 0.8 + 0.61 + 0.2 + fetch.total_s + 0.3)


def test_a_group_back_before_the_heartbeat_lapsed_completes_the_survivors_waiting_quorum_at_the_join_timeout():
    fetch = predict_fetch(STATE, 0.005, 0.005, 100e6, Transport())
    common = {"setup_s": 1.0, "before_quorum_s": 0.0, "quorum_period_s": 5.0, "rest_s": 0.1, "reconfigure_s": 0.0,
              "heartbeat_timeout_s": 5.0,
              "join_timeout_s": 2.0, "lighthouse_rtt_s": 0.0}
    early, late = (predict_heal(fetch, asked_after_kill_s=asked, **common) for asked in (1.5, 3.0))
    assert early.survivors_waiting and late.survivors_waiting
    # the survivors asked at the kill: the quorum waits for the join timeout from then, not for their period
    assert early.quorum_wait_s == pytest.approx(0.5) and late.quorum_wait_s == 0.0
    assert early.wait_low_s == early.wait_high_s


def test_a_measured_heal_is_cut_into_its_parts_and_the_whole_predicted_beside_from_the_strategys_steps(tmp_path):
    """Two groups under torchft-diloco (H = 4): east trains on; west, killed at 10 s, starts again at 12 s, sets up
    in 1 s, takes its 4 inner steps, asks for a quorum, fetches and ends its sync's step."""
    import json

    from testbed.runner.replicas import replica_figures

    east, t = [{"event": "start", "rank": 0, "time": 0.0, "replica_group": 0, "setup_s": 1.0}], 1.0
    for i in range(60):
        wall = 0.3 if (i + 1) % 4 == 0 else 0.1
        t += wall
        east.append({"event": "step", "step": i, "rank": 0, "time": t, "wall_s": wall, "manager_step": (i + 1) // 4,
                     "participants": 1 if 10 < t < 15 else 2, "pg_configure_s": 0.15 if i in (36, 52) else 0.0})
    west = [{"event": "start", "rank": 1, "time": 0.0, "replica_group": 1, "setup_s": 1.0},
            {"event": "step", "step": 0, "rank": 1, "time": 1.1, "wall_s": 0.1, "participants": 2},
            {"event": "start", "rank": 1, "time": 12.0, "replica_group": 1, "setup_s": 1.0}]
    west += [{"event": "step", "step": i, "rank": 1, "time": 13.0 + 0.1 * (i + 1), "wall_s": 0.1, "participants": 0}
             for i in range(3)]
    west.append({"event": "step", "step": 3, "rank": 1, "time": 14.6, "wall_s": 1.3, "participants": 2,
                 "healed_bytes": STATE, "healed_from": "198.18.0.10", "heal_fetch_s": 0.5, "heal_fetch_at": 13.9,
                 "quorum_first_asked_at": 13.4, "pg_configure_s": 0.2})
    for rank, records in enumerate((east, west)):
        (tmp_path / f"rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    figures = replica_figures(tmp_path, 2, [(10.0, 11.0)], ["east", "west"])
    (heal,) = figures["heals"]
    assert heal["killed_at"] == 10.0 and heal["heal_s"] == pytest.approx(2.6)
    assert (heal["before_quorum_s"], heal["quorum_wait_s"], heal["reconfigure_s"], heal["rest_s"]) == pytest.approx(
        (0.4, 0.3, 0.2, 0.2))
    assert (figures["sync_step_s"], figures["inner_step_s"], figures["quorum_period_s"], figures["reconfigure_s"]) == \
        pytest.approx((0.3, 0.1, 0.6, 0.15))
    topology = validate_data(Topology, {"name": "two", "dcs": [{"name": "east", "nodes": 1}, {"name": "west", "nodes": 1}],
                                        "links": [{"between": ["east", "west"], "latency": "5ms",
                                                   "bandwidth": "100mbit"}]}, "t.yaml")
    links = {key: LinkParams(latency=0.005, bandwidth=100e6) for key in ("east->west", "west->east")}
    options = {"strategy": "torchft-diloco", "inner_steps": 4, "heartbeat_timeout_ms": 1000}
    predict_heals(figures, topology, links, {"198.18.0.10": "east"}, ["east", "west"], Transport(), calibrated=False,
                  options=options)
    part = heal["heal_predicted"]
    # its 4 inner steps, the middle of east's 0.6 s period and the lighthouse's answer from east, the sync's rest
    assert part["before_quorum_s"] == pytest.approx(0.4) and part["rest_s"] == pytest.approx(0.2)
    assert part["quorum_wait_s"] == pytest.approx(0.3 + 0.010) and not part["survivors_waiting"]
    # east's own building of a quorum's process group (at the kill and the rejoin) stands for west's
    assert part["reconfigure_s"] == pytest.approx(0.15)
    assert heal["heal_predicted_s"] == pytest.approx(1.0 + 0.4 + 0.31 + 0.15 + heal["fetch_predicted_s"] + 0.2)
    # torchft-ddp asks at its step's start and the step follows the heal
    predict_heals(figures, topology, links, {"198.18.0.10": "east"}, ["east", "west"], Transport(), calibrated=False,
                  options=options | {"strategy": "torchft-ddp"})
    assert heal["heal_predicted"]["before_quorum_s"] == 0.0 and heal["heal_predicted"]["rest_s"] == pytest.approx(0.3)
