"""The registry and the lifecycle written once against it, with backends that build nothing (no root): a name
turns into a class in one place, options belong to a backend, bring-up saves state first and removes it on a
failure that left nothing, tear-down asks every backend, and the state file comes back typed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from testbed.fabric import lifecycle, registry
from testbed.fabric import state as state_store
from testbed.fabric.errors import FabricError
from testbed.spec.link import LinkParams
from tests.support import fake_backend
from tests.support.fake_backend import LOG, FakeBackend, FakeOptions, FakeState
from tests.support.topologies import make_topology, pair_topology

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = pair_topology("duo", latency="5ms")
PREFIX = "tbl-"
REAL = registry.targets()  # as registered when this module was imported
pytestmark = pytest.mark.usefixtures("fakes")  # only the fake backends (tests/support/fakes.py)


@pytest.fixture
def real():
    """The real backends registered instead of the fakes, for one test."""
    with registry.registered(REAL, only=True):
        yield


def test_a_name_is_turned_into_its_class_and_an_unknown_one_lists_the_registered():
    assert registry.get("fake") is FakeBackend and registry.names() == ("fake", "other")
    with pytest.raises(FabricError, match=r"^--backend: expected one of fake, other, got 'k8s'$"):
        registry.get("k8s")
    registry.register("misnamed", "tests.support.fake_backend:Misnamed")
    with pytest.raises(FabricError, match="calls itself 'something-else', registered as 'misnamed'"):
        registry.get("misnamed")


def test_a_backend_registered_for_a_block_is_gone_after_it_whatever_was_registered_meanwhile():
    before = registry.targets()
    with registry.registered({"third": "tests.support.fake_backend:FakeBackend"}):
        assert registry.names() == ("fake", "other", "third")
        registry.register("misnamed", "tests.support.fake_backend:Misnamed")
    assert registry.targets() == before
    with registry.registered({"third": "tests.support.fake_backend:FakeBackend"}, only=True):
        assert registry.names() == ("third",)
    assert registry.targets() == before


def test_the_real_backends_are_registered_under_their_own_names(real):
    assert registry.names() == ("netns", "docker", "ssh", "slurm")
    assert [backend.name for backend in registry.backends()] == ["netns", "docker", "ssh", "slurm"]


def test_an_option_of_another_backend_is_one_line_naming_who_takes_it():
    assert lifecycle.backend_options("fake", {"size": 3}) == FakeOptions(size=3)
    with pytest.raises(FabricError, match=r"^--colour is for --backend other, not fake$"):
        lifecycle.backend_options("fake", {"colour": "red"})
    with pytest.raises(FabricError, match=r"^--size: "):
        lifecycle.backend_options("fake", {"size": "many"})


def test_the_real_backends_options(real, monkeypatch):
    with pytest.raises(FabricError, match=r"^--backend ssh needs --inventory FILE$"):
        lifecycle.backend_options("ssh", {})
    with pytest.raises(FabricError, match=r"^--adopt is for --backend docker, not netns$"):
        lifecycle.backend_options("netns", {"adopt": True})
    monkeypatch.setenv("TESTBED_IMAGE", "mine:1")
    assert lifecycle.backend_options("docker", {}).image == "mine:1"


def test_bring_up_saves_the_state_first_and_keeps_it_typed():
    testbed = lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend=FakeBackend(FakeOptions(size=2)))
    assert ("up", PREFIX, "True") in LOG  # the state file existed while the fabric was built
    assert LOG.index(("resolve", "auto")) < LOG.index(("up", PREFIX, "True"))
    assert testbed.state.shaper == "netem" and testbed.plan.shaper == "netem"
    saved = state_store.load(PREFIX)
    assert saved is not None and saved.backend == "fake"
    assert saved.backend_state == FakeState(size=2, built=[s.name for s in testbed.plan.namespaces])
    raw = json.loads(state_store.state_path(PREFIX).read_text())
    assert raw["backend_state"]["size"] == 2


def test_a_failed_bring_up_removes_the_state_unless_something_is_left_to_undo():
    with pytest.raises(FabricError, match="injected"):
        lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend=FakeBackend(FakeOptions(fail="up")))
    assert state_store.load(PREFIX) is None
    with pytest.raises(FabricError, match="injected"):
        lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend=FakeBackend(FakeOptions(fail="up-leaving")))
    assert state_store.load(PREFIX).backend_state.left  # kept for `clean`


def test_a_layout_that_cannot_be_planned_names_the_file_before_anything_is_probed():
    unplannable = make_topology("unplannable", {"east": 1})
    with pytest.raises(FabricError, match=r"^topo.yaml: no layout fits$"):
        lifecycle.bring_up(unplannable, prefix=PREFIX, topology_file="topo.yaml", backend="fake")
    assert LOG == [] and state_store.load(PREFIX) is None


def test_a_stale_testbed_is_torn_down_by_every_backend_the_owner_first_with_its_record():
    lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="other")
    LOG.clear()
    lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake")
    cleans = [entry for entry in LOG if entry[0] == "clean"]
    assert cleans == [("clean", "other", PREFIX, "FakeState"), ("clean", "fake", PREFIX, "-")]
    assert state_store.load(PREFIX).backend == "fake"
    removed = lifecycle.tear_down(PREFIX)
    assert removed == [f"fake:{PREFIX}", f"other:{PREFIX}"] and state_store.load(PREFIX) is None


def test_tear_down_without_a_state_file_still_asks_every_backend():
    assert lifecycle.tear_down(PREFIX) == [f"fake:{PREFIX}", f"other:{PREFIX}"]
    state_store.state_path(PREFIX).parent.mkdir(parents=True, exist_ok=True)
    state_store.state_path(PREFIX).write_text('{"backend": "gone", "prefix": "x"}')  # unreadable: no owner
    assert state_store.load(PREFIX) is None
    assert lifecycle.tear_down(PREFIX) == [f"fake:{PREFIX}", f"other:{PREFIX}"]
    assert not state_store.state_path(PREFIX).exists()


def test_attach_rebuilds_the_testbed_from_its_state_with_live_changes():
    testbed = lifecycle.bring_up(TOPOLOGY, prefix=PREFIX, backend="fake")
    testbed.change("east->west", latency=0.03, loss=0.01)
    again = lifecycle.attach(PREFIX)
    assert again.plan.link_end("east->west").shaping.params == LinkParams(latency=0.03, loss=0.01)
    assert again.plan.link_end("west->east").shaping.params.latency == pytest.approx(0.005)
    assert isinstance(again.fabric, fake_backend.FakeFabric) and again.describe()["backend"] == "fake"
    lifecycle.tear_down(PREFIX)
    with pytest.raises(FabricError, match=f"no testbed is up with prefix '{PREFIX}'"):
        lifecycle.attach(PREFIX)


def test_no_backend_name_is_compared_outside_the_registry(real):
    """A caller that asks which backend it has (== "docker", in ("netns", ...)) instead of asking the backend."""
    names = set(registry.names())
    found = []
    for path in sorted((ROOT / "testbed").rglob("*.py")):
        if path.name == "registry.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                    if any(isinstance(v, ast.Constant) and v.value in names for v in values):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
