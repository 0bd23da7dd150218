"""A routed topology on a real Slurm (scripts/slurm-lab, one slurmd per node in a namespace of its own): the chain
a - b - c, where a and c have no direct link, is shaped end to end on the nodes (routing.compose), `status` says
which pairs are composed, the probe holds every pair within its bounds, and a live `shape` of the hop a - b
re-shapes the pair a - c composed over it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fabric.slurm import test_lab
from tests.fabric.test_backends import RTT_SLACK_MS, Backend, probe
from tests.support.slurm_lab import SlurmLab, running_lab

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.timeout(900)]

CHAIN = """name: chain-3
dcs:
  - {name: a, nodes: 1}
  - {name: b, nodes: 1}
  - {name: c, nodes: 1}
links:
  - {between: [a, b], latency: 10ms, bandwidth: 200mbit}
  - {between: [b, c], latency: 5ms, bandwidth: 100mbit}
"""
ONE_WAY_MS = {("a", "b"): 10.0, ("b", "c"): 5.0}


def configured_rtt(src: str, dst: str) -> float:
    """The chain's round trip between two DCs: every hop crossed there and back."""
    order = "abc"
    lo, hi = sorted((order.index(src), order.index(dst)))
    return 2 * sum(ONE_WAY_MS[(order[i], order[i + 1])] for i in range(lo, hi))


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("chain") / "chain-3.yaml"
    path.write_text(CHAIN)
    return path


@pytest.fixture(scope="module")
def lab(topology: Path) -> Iterator[SlurmLab]:
    with running_lab(topology, f"tb{uuid.uuid4().hex[:6]}") as made:
        yield made


@pytest.fixture
def slurm(lab: SlurmLab, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Backend:
    monkeypatch.setattr(test_lab, "NODES", ("a-0", "b-0", "c-0"))
    return test_lab.backend_on(lab, prefix, monkeypatch)


def test_a_chain_is_shaped_end_to_end_and_a_hops_change_reshapes_the_pair_over_it(slurm: Backend, topology: Path):
    up = run_cli("up", "--backend", "slurm", str(topology), timeout=300)
    assert up.returncode == 0, up.stderr[-2000:]
    status = json.loads(run_cli("status", "--json", check=True).stdout)
    assert status["composed"] == {"a->c": ["a->b", "b->c"], "c->a": ["c->b", "b->a"]}
    routed = {link["key"]: link for link in status["links"] if link["kind"] == "routed"}
    assert set(routed) == {"a->c", "c->a"} and routed["a->c"]["latency"] == "15ms"
    for link in status["links"]:
        assert "NOT" not in link["mechanism"], link

    pairs = probe(slurm)
    assert {frozenset(pair) for pair in pairs} == {frozenset("ab"), frozenset("bc"), frozenset("ac")}
    for (src, dst), pair in pairs.items():
        expected = configured_rtt(src, dst)
        assert pair["rtt_applied_ms"] == pytest.approx(expected) and pair["not_applied"] == "", pair
        floor = pair["rtt_floor_ms"] or 0.0
        assert expected <= pair["rtt_p50_ms"] <= expected + floor + RTT_SLACK_MS, pair

    shaped = run_cli("shape", "a", "b", "--latency", "1ms")
    assert shaped.returncode == 0, shaped.stderr[-2000:]
    ONE_WAY_MS[("a", "b")] = 1.0
    try:
        status = json.loads(run_cli("status", "--json", check=True).stdout)
        assert {link["key"]: link["latency"] for link in status["links"]}["a->c"] == "6ms"
        for (src, dst), pair in probe(slurm).items():
            expected = configured_rtt(src, dst)
            floor = pair["rtt_floor_ms"] or 0.0
            assert expected <= pair["rtt_p50_ms"] <= expected + floor + RTT_SLACK_MS, pair
    finally:
        ONE_WAY_MS[("a", "b")] = 10.0

    down = run_cli("down", timeout=300)
    assert down.returncode == 0, down.stderr[-2000:]
    assert slurm.leftovers() == []
