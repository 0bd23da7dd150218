"""Experiment files and their expansion into cells (no root)."""


import pytest

from testbed.runner.cells import plan_cells
from testbed.spec import SpecError
from testbed.spec.experiment import load_experiment
from tests.conftest import ROOT
from tests.support.malformed import MALFORMED, THREE_UNEQUAL, write

EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))

GOOD = """name: t
topology: {topology}
workload: {{steps: 4, warmup_steps: 1}}
strategies: [flat-dp, {{name: hier, strategy: hier-dp, options: {{compression: int8}}}}]
"""


@pytest.mark.parametrize("path", EXPERIMENTS, ids=[p.stem for p in EXPERIMENTS])
def test_shipped_experiments_load_and_state_their_claim(path):
    experiment, topology = load_experiment(path)
    assert plan_cells(experiment, topology)
    assert path.read_text().startswith("# "), "each experiment states the published claim it mirrors"


def test_cells_cover_strategies_sweep_repetitions_and_baselines(tmp_path):
    path = tmp_path / "e.yaml"
    path.write_text(GOOD.format(topology=ROOT / "topologies" / "two-dc.yaml") +
                    "repetitions: 2\nsweep:\n  links[east,west].latency: [0ms, 20ms]\n  workload.micro_batches: [1, 2]\n")
    experiment, topology = load_experiment(path)
    cells = plan_cells(experiment, topology)
    shaped = [c for c in cells if not c.baseline]
    baselines = [c for c in cells if c.baseline]
    assert len(shaped) == 2 * 2 * 2 * 2 and len(baselines) == 2 * 2 * 2  # per strategy x workload point x rep
    assert all(p["latency"] == 0 and p["bandwidth"] is None for c in baselines for p in c.links.values())
    far = next(c for c in shaped if c.sweep["links[east,west].latency"] == "20ms")
    assert far.links["east->west"]["latency"] == pytest.approx(0.02) and far.links["west->east"]["latency"] == pytest.approx(0.02)
    assert far.links["east->west"]["bandwidth"] == pytest.approx(1e9)  # the rest of the link is the topology's
    hier = next(c for c in shaped if c.strategy == "hier")
    assert hier.options["strategy"] == "hier-dp" and hier.options["compression"] == "int8"
    args = hier.workload_args()
    assert args[args.index("--compression") + 1] == "int8" and args[args.index("--steps") + 1] == "4"
    assert len({c.id for c in cells}) == len(cells)


def test_distance_sweeps_become_fibre_latency(tmp_path):
    experiment, topology = load_experiment(ROOT / "experiments" / "distance-sweep.yaml")
    cells = [c for c in plan_cells(experiment, topology) if not c.baseline]
    far = next(c for c in cells if c.sweep["links[east,west].distance"] == "4000km")
    assert far.links["east->west"]["latency"] == pytest.approx(4000 * 4.9e-6)


@pytest.mark.parametrize("extra,field,needle", [
    ("sweep:\n  links[east,north].latency: [1ms]\n", "sweep.links[east,north].latency", "no link between east and north"),
    ("sweep:\n  links[east,west].latency: [soon]\n", "sweep.links[east,west].latency", "duration"),
    ("sweep:\n  colour: [red]\n", "sweep.colour", "expected links"),
    ("sweep:\n  workload.nonsense: [1]\n", "sweep.workload.nonsense", "unknown workload option"),
    ("thresholds: [{metric: speed, min: 1}]\n", "thresholds[0].metric", "expected 'tokens_per_s',"),
    ("thresholds: [{metric: tokens_per_s}]\n", "thresholds[0]", "give min, max or both"),
    ("repetitions: 0\n", "repetitions", "must be at least 1, got 0"),
])
def test_bad_experiments_give_one_line(tmp_path, extra, field, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(GOOD.format(topology=ROOT / "topologies" / "two-dc.yaml") + extra)
    with pytest.raises(SpecError) as caught:
        load_experiment(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: {field}") and needle in message, message


@pytest.mark.parametrize("strategies,field,needle", [
    ("[warp-drive]", "strategies[0]", "unknown strategy 'warp-drive'"),
    ("[{name: x, strategy: flat-dp, options: {turbo: 1}}]", "strategies[0]", "options.turbo"),
    ("[flat-dp, flat-dp]", "strategies[1].name", "duplicate"),
])
def test_bad_strategies_give_one_line(tmp_path, strategies, field, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: t\ntopology: {ROOT / 'topologies' / 'two-dc.yaml'}\nstrategies: {strategies}\n")
    with pytest.raises(SpecError) as caught:
        load_experiment(path)
    assert str(caught.value).startswith(f"{path}: {field}") and needle in str(caught.value), str(caught.value)


@pytest.mark.parametrize("case", sorted(MALFORMED), ids=sorted(MALFORMED))
def test_malformed_experiments_are_refused_at_load_time_with_one_line(tmp_path, case):
    path = write(tmp_path, case)
    _, field, needle = MALFORMED[case]
    with pytest.raises(SpecError) as caught:
        load_experiment(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: {field}: ") and needle in message, message


def test_each_malformed_case_is_one_edit_from_a_good_file(tmp_path):
    """The table's files are otherwise valid: the good twin of one of each kind loads."""
    from tests.support.malformed import LATENCY, text

    good = {"chunks": text("[flat-dp, {name: o, strategy: hier-dp-overlap, options: {chunks: 4}}]"),
            "where": text("[flat-dp]", sweep=LATENCY, thresholds="{metric: tokens_per_s, strategy: flat-dp, "
                                                               "where: {latency: 20ms}, min: 1}"),
            "unequal": text("[flat-dp, {name: d, strategy: diloco, options: {inner_steps: 2}}, pp]",
                            topology=THREE_UNEQUAL),
            "pytorch": text("[ddp, {name: p, strategy: ddp, options: {comm_hook: powersgd, powersgd_rank: 2}}, "
                            "{name: q, strategy: ddp, options: {comm_hook: powersgd, bucket_cap_mb: 1}}, fsdp, "
                            "hsdp]"),
            "fsdp_unequal": text("[ddp, fsdp]", topology=THREE_UNEQUAL),
            "diloco_restarts": text("[flat-dp, {name: s, strategy: streaming-diloco, options: {inner_steps: 2}}, "
                                    "{name: a, strategy: async-diloco, options: {inner_steps: 2}}]",
                                    extra="restarts: 1\ncheckpoint_every: 4\n")}
    for name, body in good.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(body)
        load_experiment(path)
