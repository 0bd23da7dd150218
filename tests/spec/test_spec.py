"""Topology files: the shipped ones load; every malformed one gives ONE line naming file, field, problem."""

from pathlib import Path

import pytest

from testbed.spec import SpecError, load_topology
from testbed.spec.topology import DEFAULT_SUBNET
from tests.conftest import TOPOLOGIES

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
    "zero_nodes": ("name: x\ndcs:\n  - {name: east, nodes: 0}\n", "dcs[0].nodes", "must be at least 1, got 0"),
    "bad_dc_name": ("name: x\ndcs:\n  - {name: East-Coast, nodes: 1}\n", "dcs[0].name",
                    "a lowercase letter, then up to 11 lowercase letters, digits or _"),
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
    "not_a_mapping": ("- just\n- a list\n", "", "expected a topology with name, dcs and links"),
    "empty_file": ("# nothing yet\n", "", "the file is empty; expected a topology with name, dcs and links"),
    "bare_latency": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 5}]\n",
                     "links[0].latency", "5 has no unit: write it with one, e.g. 5ms"),
    "minutes_or_metres": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 5m}]\n",
                          "links[0].latency", "reads two ways: minutes, or metres"),
    "gbps": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], bandwidth: 10Gbps}]\n",
             "links[0].bandwidth", "gigabytes per second as tc reads it"),
    "bare_bandwidth": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], bandwidth: 1000000000}]\n",
                       "links[0].bandwidth", "has no unit"),
    "bare_distance": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], distance: 800}]\n",
                      "links[0].distance", "800 has no unit"),
    "bare_jitter": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 5ms, jitter: 2}]\n",
                    "links[0].jitter", "2 has no unit"),
    "beyond_geostationary": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 10s}]\n",
                             "links[0].latency", "longer than any real link"),
    "round_the_world_twice": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], distance: 90000km}]\n",
                              "links[0].distance", "longer than any fibre route on Earth"),
    "jitter_beyond_latency": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 2ms, jitter: 5ms}]\n",
                              "links[0].jitter", "more than the latency"),
    "reverse_jitter_beyond_latency": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 8ms, "
                                      "jitter: 2ms, reverse: {latency: 1ms}}]\n",
                                      "links[0].reverse.jitter", "more than the latency (1ms)"),
    "queue_beyond_memory": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 10ms, "
                            "queue: 100000000000}]\n", "links[0].queue", "of this machine's memory"),
    "loss_as_a_bare_percentage": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], loss: 5}]\n",
                                  "links[0].loss", "would be 500%: write 5%"),
    "typo_key": ("name: x\n" + GOOD_DCS + "links: [{between: [east, west], bandwith: 1gbit}]\n",
                 "links[0].bandwith", "unknown key (did you mean bandwidth?)"),
    "typo_top_key": ("name: x\n" + GOOD_DCS + "link: [{between: [east, west]}]\n",
                     "link", "unknown key (did you mean links?)"),
    "typo_dc": ("name: x\n" + GOOD_DCS + "links: [{between: [east, wset]}]\n",
                "links[0].between", "unknown DC 'wset' (did you mean west?)"),
    "nodes_in_words": ("name: x\ndcs:\n  - {name: east, nodes: two}\n", "dcs[0].nodes",
                       "expected a whole number, got 'two'"),
}

PYTHON_OR_PYDANTIC = ("NoneType", "Input should", "pattern", "^[", "type=", "validation error", "dict", "str_type",
                      "int_parsing", "Value error", "pydantic")


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
    for phrase in PYTHON_OR_PYDANTIC:
        assert phrase not in message, message


def test_a_latency_beyond_150ms_is_said_once_on_stderr_and_accepted(tmp_path: Path, capsys):
    path = tmp_path / "satellite.yaml"
    path.write_text("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 250ms}]\n")
    for _ in range(2):
        assert load_topology(path).links[0].forward().latency == pytest.approx(0.25)
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"warning: {path}: links[0].latency: 250ms one way is more than any terrestrial path has "
                     "(ITU-T G.114 plans one-way delay up to 150 ms; beyond it, satellite hops): going on"]
    path.write_text("name: x\n" + GOOD_DCS + "links: [{between: [east, west], latency: 150ms}]\n")
    load_topology(path)
    assert capsys.readouterr().err == ""


def test_a_topology_testbed_wrote_reads_its_si_numbers_back():
    from testbed.spec.topology import topology_from_data

    written = load_topology(TOPOLOGIES / "asymmetric.yaml").model_dump(mode="json")
    again = topology_from_data(written, si=True)
    assert again.links[0].backward() == load_topology(TOPOLOGIES / "asymmetric.yaml").links[0].backward()
    with pytest.raises(SpecError, match="has no unit"):
        topology_from_data(written)


def test_missing_file_is_one_line(tmp_path: Path):
    with pytest.raises(SpecError, match="cannot read file"):
        load_topology(tmp_path / "nope.yaml")
