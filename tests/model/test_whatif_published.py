"""whatif held to published results (root-free): the shipped published scenarios' checks, and each new scenario
option changes the figures it should (so an ignored option fails a test)."""

from __future__ import annotations

import pytest

from testbed.model.whatif import check_figures, evaluate_point
from testbed.spec.scenario import load_scenario
from tests.conftest import ROOT


def scenario(name: str):
    return load_scenario(ROOT / "scenarios" / f"{name}.yaml")


@pytest.mark.parametrize("name", ["intellect-1-usa", "intellect-1-usa-europe", "intellect-1-global",
                                  "nemotron-340b-two-dc"])
def test_published_utilisations_and_efficiency_are_reproduced(name):
    rows = check_figures(scenario(name))
    assert rows and all(row["verdict"] == "PASS" for row in rows), [row["line"] for row in rows]


def test_streaming_diloco_table_4_within_one_grid_step_for_most_cells():
    rows = [row for size in ("1b", "10b", "100b") for row in check_figures(scenario(f"streaming-diloco-{size}"))]
    assert len(rows) == 75
    assert sum(row["verdict"] == "PASS" for row in rows) >= 0.8 * len(rows)


def _with(s, name, **change):
    strategy = next(x for x in s.strategies if x.name == name)
    return strategy.model_copy(update=change)


def test_each_outer_option_changes_the_prediction():
    s = scenario("streaming-diloco-10b")
    bw, d = 5e9, 1e3
    base = _with(s, "diloco")
    cu = evaluate_point(s, base, d, bw).compute_utilisation
    after = evaluate_point(s, _with(s, "diloco", outer_start="after-step"), d, bw).compute_utilisation
    fp4 = evaluate_point(s, _with(s, "diloco", outer_precision="fp4"), d, bw)
    topk = evaluate_point(s, _with(s, "diloco", outer_topk=0.01), d, bw)
    assert after < cu < fp4.compute_utilisation < topk.compute_utilisation
    assert fp4.inter_dc_gbit_per_step == pytest.approx(evaluate_point(s, base, d, bw).inter_dc_gbit_per_step / 4)
    tau0 = evaluate_point(s, _with(s, "streaming-diloco-overlap", overlap_steps=0), d, bw).compute_utilisation
    tau1 = evaluate_point(s, _with(s, "streaming-diloco-overlap"), d, bw).compute_utilisation
    assert tau0 < tau1


def test_the_slowest_hop_of_a_ring_bounds_it():
    s = scenario("intellect-1-global")
    strategy = s.strategies[0]
    slow = evaluate_point(s, strategy, 1e3, 4e9)
    fast_ring = [h.model_copy(update={"bandwidth": 4e9}) for h in s.ring]
    fast = evaluate_point(s.model_copy(update={"ring": fast_ring}), strategy, 1e3, 4e9)
    assert slow.step_s > fast.step_s
    # the published median all-reduce, 469 s, is what the ring's slowest hop gives (int8, 14 nodes)
    assert slow.exposed_s * strategy.inner_steps == pytest.approx(469, rel=0.01)


def test_a_published_figure_off_the_model_fails():
    s = scenario("intellect-1-usa")
    figure = s.published_figures[0].model_copy(update={"value": 0.90})
    rows = check_figures(s.model_copy(update={"published_figures": [figure]}))
    assert rows[0]["verdict"] == "FAIL" and rows[0]["line"].startswith("FAIL")


def test_a_published_figure_for_an_unknown_strategy_is_refused_naming_the_field(tmp_path):
    import subprocess
    import sys

    text = (ROOT / "scenarios" / "intellect-1-usa.yaml").read_text().replace("strategy: diloco-int8", "strategy: x")
    path = tmp_path / "s.yaml"
    path.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", "whatif", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and str(path) in proc.stderr and "published_figures[0].strategy" in proc.stderr


def test_an_object_store_exchange_costs_one_upload_and_the_gathered_downloads():
    """Covenant's exchange (its code's): the peer's upload over its uplink, then `gather` payloads fetched at once
    over its downlink; each term moves the outer sync as its bytes over its rate say."""
    from testbed.model.outer import outer_bytes

    s = scenario("covenant-72b")
    strategy = s.strategies[0]
    up, h = 110e6, strategy.inner_steps
    nbytes = outer_bytes(s.model, strategy)

    def outer(**store) -> float:
        changed = s.model_copy(update={"object_store": s.object_store.model_copy(update=store)})
        return evaluate_point(changed, strategy, 1e3, up).exposed_s * h

    base = outer()
    assert base == pytest.approx(nbytes * 8 / up + 20 * nbytes * 8 / 500e6, rel=1e-3)
    assert base - outer(gather=10) == pytest.approx(10 * nbytes * 8 / 500e6, rel=1e-3)
    assert base - outer(download=1e9) == pytest.approx(20 * nbytes * 8 / 1e9, rel=1e-3)
    assert base - outer(upload=220e6) == pytest.approx(nbytes * 8 / 220e6, rel=1e-3)
    # the code's payload: 2-bit values and 12-bit indices of 1.5625 % of the values, 146x against fp32
    assert s.model.parameters * 4 / nbytes == pytest.approx(146.3, rel=1e-3)


def test_a_ring_and_an_object_store_together_are_refused(tmp_path):
    import subprocess
    import sys

    text = (ROOT / "scenarios" / "covenant-72b.yaml").read_text()
    path = tmp_path / "s.yaml"
    path.write_text(text + "ring: [" + ", ".join(["{}"] * 20) + "]\n")
    proc = subprocess.run([sys.executable, "-m", "testbed.cli", "whatif", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and str(path) in proc.stderr and "object_store" in proc.stderr, proc.stderr
