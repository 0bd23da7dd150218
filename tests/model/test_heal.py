"""testbed.model.heal: a torchft heal's fetch of a healthy group's state, and the runner's prediction beside it."""

from __future__ import annotations

import pytest

from testbed.model.heal import predict_fetch
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
                  ["east", "west", "north"], Transport(), calibrated=False)
    via_west, direct = figures["heals"][0], figures["heals"][1]
    # east -> north is routed over west: 25 ms one way, the narrowest hop's 100 Mbit/s
    assert via_west["healed_from_dc"] == "east" and via_west["fetch_predicted"]["handshake_s"] == pytest.approx(0.075)
    assert direct["fetch_predicted"]["handshake_s"] == pytest.approx(0.060)
    assert via_west["fetch_predicted_s"] > direct["fetch_predicted_s"] > STATE * 8 / 100e6
    assert via_west["fetch_transport"] == "first guesses"
    assert "fetch_predicted_s" not in figures["heals"][2]  # nothing fetched, nothing predicted
