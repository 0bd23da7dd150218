"""Topology files: the shipped ones load; every malformed one gives ONE line naming file, field, problem."""

from pathlib import Path

import pytest

from testbed.spec import SpecError, load_topology
from testbed.spec.topology import DEFAULT_SUBNET

from ..conftest import TOPOLOGIES

SHIPPED = sorted(TOPOLOGIES.glob("*.yaml"))

GOOD_DCS = "dcs:\n  - {name: east, nodes: 2}\n  - {name: west, nodes: 2}\n"

MALFORMED = {
    "unknown_key": ("name: x\ncolour: blue\n" + GOOD_DCS + "links: [{between: [east, west]}]\n",
                    "colour", "unknown key"),
    "wrong_unit": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 10 parsecs}]\n",
                   "links[0].latency", "duration"),
    "negative_latency": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: -5ms}]\n",
                         "links[0].latency", "negative"),
    "unknown_dc": ("name: x\n" + GOOD_DCS + "links: [{between: [east, north], latency: 5ms}]\n",
                   "links[0].between", "unknown DC 'north'"),
    "duplicate_dc": ("name: x\ndcs:\n  - {name: east, nodes: 1}\n  - {name: east, nodes: 2}\n",
                     "dcs[1].name", "duplicate"),
    "too_many_nodes": ("name: x\nsubnet: 198.18.0.0/26\ndcs:\n  - {name: east, nodes: 40}\n  - {name: west, nodes: 40}\n"
                       "links: [{between: [east, west]}]\n", "subnet", "too small"),
    "unreachable": ("name: x\ndcs:\n  - {name: a, nodes: 1}\n  - {name: b, nodes: 1}\n  - {name: c, nodes: 1}\n"
                    "links: [{between: [a, b]}]\n", "links", "'c' cannot be reached"),
    "latency_and_distance": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 5ms, distance: 1km}]\n",
                             "links[0]", "not both"),
    "bad_loss": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], loss: 120%}]\n",
                 "links[0].loss", "between 0% and 100%"),
    "zero_nodes": ("name: x\ndcs:\n  - {name: east, nodes: 0}\n", "dcs[0].nodes", "greater than or equal to 1"),
    "bad_dc_name": ("name: x\ndcs:\n  - {name: East-Coast, nodes: 1}\n", "dcs[0].name", "pattern"),
    "same_dc_twice": ("name: x\n" + GOOD_DCS + "links: [{between: [east, east]}]\n", "links[0]", "two different"),
    "duplicate_link": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west]}, {between: [west, east]}]\n",
                       "links[1].between", "second link"),
    "bad_subnet": ("name: x\nsubnet: 10.0.0.1/8\n" + GOOD_DCS + "links: [{between: [east, west]}]\n",
                   "subnet", "IPv4 network"),
    "bad_queue": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], queue: lots}]\n",
                  "links[0].queue", "positive number of packets"),
    "bad_reverse": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], reverse: {latency: soon}}]\n",
                    "links[0].reverse.latency", "duration"),
    "missing_dcs": ("name: x\n", "dcs", "required key is missing"),
    "not_yaml": ("name: [x\n", "line", "invalid YAML"),
    "not_a_mapping": ("- just\n- a list\n", "", "mapping"),
}


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_shipped_topologies_load(path):
    topology = load_topology(path)
    assert topology.dcs and topology.subnet == DEFAULT_SUBNET


def test_the_documented_contract():
    t = load_topology(TOPOLOGIES / "two-dc.yaml")
    assert [dc.node_names() for dc in t.dcs] == [["east-0", "east-1"], ["west-0", "west-1"]]
    link = t.links[0]
    assert link.forward().latency == pytest.approx(0.010)
    assert link.forward().bandwidth == pytest.approx(1e9)
    assert link.forward().queue is None  # auto


def test_distance_sets_fibre_latency_and_reverse_overrides():
    ring = load_topology(TOPOLOGIES / "three-dc-ring.yaml")
    assert ring.links[0].forward().latency == pytest.approx(800 * 4.9e-6)
    asym = load_topology(TOPOLOGIES / "asymmetric.yaml").links[0]
    assert asym.forward().latency == pytest.approx(0.010) and asym.forward().bandwidth == pytest.approx(1e9)
    assert asym.backward().latency == pytest.approx(0.012) and asym.backward().bandwidth == pytest.approx(5e8)


@pytest.mark.parametrize("case", sorted(MALFORMED), ids=sorted(MALFORMED))
def test_malformed_files_give_one_clear_line(tmp_path: Path, case: str):
    text, field, needle = MALFORMED[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_topology(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: {field}"), message
    assert needle in message, message


def test_missing_file_is_one_line(tmp_path: Path):
    with pytest.raises(SpecError, match="cannot read file"):
        load_topology(tmp_path / "nope.yaml")
