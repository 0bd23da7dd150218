"""Nothing a user types by accident is taken to mean something else: a table of malformed inputs across topology,
experiment, scenario and fault files and CLI options, each refused by the command a user would run, before
anything is built: exit 2, one line on stderr naming the file (or command) and the field, in the project's words.

Every case is one edit of a good file (test_each_case_is_one_edit_from_a_good_input checks the good ones load).
The commands run in this process (typer's runner: the same app, arguments and error path), three also as the real
command, whose exit status and stderr a user sees."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from testbed.cli.commands import app
from testbed.spec.experiment import load_experiment
from testbed.spec.scenario import load_scenario
from testbed.spec.topology import load_topology
from tests.conftest import ROOT, namespaces_with, run_cli

TOPOLOGY = """name: pair
dcs:
  - {name: east, nodes: 2, intra: {bandwidth: 10gbit}}
  - {name: west, nodes: 2}
links:
  - {between: [east, west], latency: 10ms, bandwidth: 1gbit, jitter: 0ms, loss: 0%}
"""
EXPERIMENT = """name: bad
topology:
  name: pair
  dcs: [{name: east, nodes: 2}, {name: west, nodes: 2}]
  links: [{between: [east, west], latency: 2ms, jitter: 0ms, bandwidth: 1gbit}]
workload: {steps: 6, warmup_steps: 1, micro_batches: 2}
strategies: [flat-dp, hier-dp]
sweep:
  links[east,west].latency: [1ms, 20ms]
thresholds:
  - {metric: tokens_per_s, strategy: hier-dp, min: 1}
faults:
  - {kind: latency, between: [east, west], at: step 2, duration: 1s, latency: 80ms, jitter: 5ms}
calibrate: none
"""
SCENARIO = (ROOT / "scenarios" / "geopipe-pipeline.yaml").read_text()
RUN_DIR = "RUN_DIR"  # a run directory with a manifest (for `testbed check`)

PYTHON_OR_PYDANTIC = ("NoneType", "Input should", "pattern", "^[", "type=", "validation error", "str_type",
                      "int_parsing", "Value error", "pydantic", "Traceback", "dict[", "float_")


@dataclass(frozen=True)
class Case:
    kind: str  # topology | experiment | scenario | fault (in an experiment) | cli
    edit: tuple[str, str] | str | None  # (old, new) in the good file; a whole file's text; None: CLI options only
    field: str  # what the line must name after "file: " ("" for the file as a whole)
    needle: str  # a word of the problem
    argv: tuple[str, ...] = ()  # cli: the command line (FILE: the written file)


def topo(old: str, new: str, field: str, needle: str) -> Case:
    return Case("topology", (old, new), field, needle)


def exp(old: str, new: str, field: str, needle: str, kind: str = "experiment") -> Case:
    return Case(kind, (old, new), field, needle)


def scen(old: str, new: str, field: str, needle: str) -> Case:
    return Case("scenario", (old, new), field, needle)


def cli(argv: tuple[str, ...], field: str, needle: str) -> Case:
    return Case("cli", None, field, needle, argv)


LINK = "latency: 10ms, bandwidth: 1gbit"
CASES: dict[str, Case] = {
    # the rows of issue 40's table, in its order
    "bare_latency": topo("latency: 10ms", "latency: 5", "links[0].latency", "5 has no unit: write it with one, e.g. 5ms"),
    "latency_in_m": topo("latency: 10ms", "latency: 5m", "links[0].latency", "reads two ways: minutes, or metres"),
    "latency_of_ten_seconds": topo("latency: 10ms", "latency: 10s", "links[0].latency",
                                   "longer than any real link has: a geostationary satellite hop"),
    "bandwidth_in_gbps": topo("bandwidth: 1gbit", "bandwidth: 10Gbps", "links[0].bandwidth",
                              "gigabits per second as networking writes it, or gigabytes per second as tc reads it"),
    "bare_bandwidth": topo("bandwidth: 1gbit", "bandwidth: 1000000000", "links[0].bandwidth",
                           "has no unit: write it with one"),
    "bare_distance": topo(LINK, "distance: 800, bandwidth: 1gbit", "links[0].distance", "800 has no unit"),
    "bare_jitter": topo("jitter: 0ms", "jitter: 2", "links[0].jitter", "2 has no unit"),
    "twice_round_the_earth": topo(LINK, "distance: 90000km, bandwidth: 1gbit", "links[0].distance",
                                  "longer than any fibre route on Earth"),
    "sweep_of_bare_numbers": exp("[1ms, 20ms]", "[0, 20]", "sweep.links[east,west].latency[1]", "20 has no unit"),
    "sweep_in_minutes": exp("[1ms, 20ms]", "[1ms, 2m]", "sweep.links[east,west].latency[1]",
                            "reads two ways: minutes, or metres"),
    "typo_of_a_key": topo("bandwidth: 1gbit", "bandwith: 1gbit", "links[0].bandwith",
                          "unknown key (did you mean bandwidth?)"),
    "empty_file": Case("topology", "# to do\n", "", "the file is empty; expected a topology with name, dcs and links"),
    "bad_dc_name": topo("name: east, nodes: 2", "name: East-Coast, nodes: 2", "dcs[0].name",
                        "a DC name: a lowercase letter, then up to 11 lowercase letters, digits or _"),
    "tolerance_without_percent": cli(("check", RUN_DIR, "--tolerance", "5"), "testbed check: --tolerance",
                                     "would be 500%: write 5%"),
    # more of the same: topology files
    "jitter_beyond_latency": topo("jitter: 0ms", "jitter: 20ms", "links[0].jitter", "more than the latency (10ms)"),
    "queue_beyond_memory": topo("loss: 0%", "loss: 0%, queue: 100000000000", "links[0].queue",
                                "of this machine's memory"),
    "loss_as_a_bare_percentage": topo("loss: 0%", "loss: 5", "links[0].loss", "would be 500%: write 5%"),
    "typo_of_a_dc": topo("between: [east, west]", "between: [east, wets]", "links[0].between",
                         "unknown DC 'wets' (did you mean west?)"),
    "access_link_in_gbps": topo("intra: {bandwidth: 10gbit}", "intra: {bandwidth: 10gbps}", "dcs[0].intra.bandwidth",
                                "reads two ways"),
    "list_as_a_file": Case("topology", "- east\n- west\n", "", "expected a topology with name, dcs and links"),
    "nodes_in_words": topo("nodes: 2, intra", "nodes: two, intra", "dcs[0].nodes", "expected a whole number, got 'two'"),
    # experiment files
    "typo_of_a_strategy": exp("[flat-dp, hier-dp]", "[flat-dp, hier-dpp]", "strategies[1].strategy",
                              "unknown strategy 'hier-dpp' (did you mean hier-dp?)"),
    "typo_of_a_metric": exp("metric: tokens_per_s", "metric: tokens_per_sec", "thresholds[0].metric",
                            "(did you mean tokens_per_s?)"),
    "typo_of_a_top_key": exp("strategies:", "strategis:", "strategis", "unknown key (did you mean strategies?)"),
    "typo_of_a_swept_option": exp("sweep:\n", "sweep:\n  workload.micro_batchs: [2, 4]\n",
                                  "sweep.workload.micro_batchs", "(did you mean micro_batches?)"),
    "typo_of_a_swept_field": exp("links[east,west].latency:", "links[east,west].latncy:",
                                 "sweep.links[east,west].latncy", "(did you mean links[east,west].latency?)"),
    "swept_latency_below_the_jitter": exp("jitter: 0ms", "jitter: 2ms", "sweep.links[east,west].latency",
                                          "jitter: 2ms is more than the latency (1ms)"),
    "swept_latency_beyond_geostationary": exp("[1ms, 20ms]", "[1ms, 400ms]", "sweep.links[east,west].latency[1]",
                                              "longer than any real link"),
    "experiment_empty": Case("experiment", "", "", "the file is empty; expected an experiment"),
    "bare_cell_timeout": exp("calibrate: none", "calibrate: none\ncell_timeout: 600", "cell_timeout",
                             "600 has no unit: write it with one, e.g. 600s"),
    "cell_timeout_in_m": exp("calibrate: none", "calibrate: none\ncell_timeout: 10m", "cell_timeout",
                             "reads two ways: minutes, or metres (a distance); write 10min"),
    "threshold_on_a_misspelt_strategy": exp("strategy: hier-dp, min", "strategy: hierdp, min",
                                            "thresholds[0].strategy", "(did you mean hier-dp?)"),
    # faults (an experiment's timeline)
    "fault_bare_latency": exp("latency: 80ms", "latency: 80", "faults[0].latency", "80 has no unit", "fault"),
    "fault_at_a_bare_number": exp("at: step 2", "at: 4", "faults[0].at", "write 'step 4' for a step or 4s", "fault"),
    "fault_on_a_misspelt_dc": exp("between: [east, west], at", "between: [east, wst], at", "faults[0].between",
                                  "no DC named 'wst' (did you mean west?)", "fault"),
    "fault_jitter_beyond_latency": exp("jitter: 5ms}", "jitter: 90ms}", "faults[0].jitter",
                                       "more than the latency (80ms)", "fault"),
    "fault_latency_beyond_geostationary": exp("latency: 80ms", "latency: 1s", "faults[0].latency",
                                              "longer than any real link", "fault"),
    "fault_of_a_misspelt_kind": exp("kind: latency", "kind: latncy", "faults[0].kind", "(did you mean latency?)",
                                    "fault"),
    "fault_duration_in_m": exp("duration: 1s", "duration: 1m", "faults[0].duration", "reads two ways", "fault"),
    # what-if scenarios (testbed whatif)
    "scenario_bare_reference_distance": scen("distance: 1000km, bandwidth: 800gbit", "distance: 1000, bandwidth: 800gbit",
                                             "reference.distance", "1000 has no unit"),
    "scenario_sweep_in_gbps": scen("[100gbit, 200gbit,", "[100Gbps, 200gbit,", "sweep.bandwidth[0]",
                                   "gigabytes per second as tc reads it"),
    "scenario_window_in_mb": scen("window: 4MB", "window: 4mb", "transport.window", "megabits or megabytes"),
    "scenario_bare_intra_latency": scen("latency: 5us", "latency: 5", "intra.latency", "5 has no unit"),
    "scenario_distance_round_the_earth": scen("2000km, 4000km]", "2000km, 90000km]", "sweep.distance[5]",
                                              "longer than any fibre route"),
    "scenario_misspelt_kind": scen("kind: pp-across}", "kind: pp-acros}", "strategies[0].kind",
                                   "(did you mean pp-across?)"),
    # CLI options
    "shape_bare_latency": cli(("shape", "east", "west", "--latency", "5"), "testbed shape: --latency",
                              "'5' has no unit"),
    "shape_rate_in_mbps": cli(("shape", "east", "west", "--bandwidth", "500mbps"), "testbed shape: --bandwidth",
                              "megabytes per second as tc reads it"),
    "shape_jitter_beyond_latency": cli(("shape", "east", "west", "--latency", "2ms", "--jitter", "5ms"),
                                       "testbed shape: --jitter", "more than the latency"),
    "shape_distance_round_the_earth": cli(("shape", "east", "west", "--distance", "90000km"),
                                          "testbed shape: --distance", "longer than any fibre route"),
    "fault_for_a_bare_number": cli(("fault", "partition", "east", "west", "--for", "5"), "testbed fault: --for",
                                   "'5' has no unit"),
    "fault_latency_in_m": cli(("fault", "latency", "east", "west", "--for", "1s", "--latency", "10m"),
                              "testbed fault: --latency", "reads two ways"),
    "fault_misspelt_kind": cli(("fault", "partiton", "east", "west", "--for", "1s"), "testbed fault: KIND A B",
                               "(did you mean partition?)"),
    "run_timeout_bare": cli(("run", "FILE", "--out", "OUT", "--timeout", "600"), "testbed run: --timeout",
                            "'600' has no unit: write it with one, e.g. 600s"),
    "run_timeout_in_m": cli(("run", "--topology", "FILE", "--out", "OUT", "--timeout", "10m", "--", "true"),
                            "testbed run: --timeout", "reads two ways: minutes, or metres"),
    "run_timeout_of_nothing": cli(("run", "FILE", "--out", "OUT", "--timeout", "0s"), "testbed run: --timeout",
                                  "must be more than 0"),
    "run_unknown_option": cli(("run", "FILE", "--out", "OUT", "--dry-run"), "testbed run: --dry-run",
                              "no such option or argument of an experiment's run"),
    "probe_seconds_bare": cli(("probe", "FILE", "--seconds", "2"), "testbed probe: --seconds",
                              "'2' has no unit: write it with one, e.g. 2s"),
    "probe_seconds_negative": cli(("probe", "--seconds", "-1s"), "testbed probe: --seconds", "cannot be negative"),
    "tolerance_beyond_everything": cli(("check", RUN_DIR, "--tolerance", "150%"), "testbed check: --tolerance",
                                       "between 0% and 100%"),
}
AS_PROCESSES = ("bare_latency", "sweep_of_bare_numbers", "tolerance_without_percent", "run_timeout_bare")
GOOD = {"topology": TOPOLOGY, "experiment": EXPERIMENT, "fault": EXPERIMENT, "scenario": SCENARIO}
COMMAND = {"topology": ("up", "FILE", "--dry-run"), "experiment": ("plan", "FILE"), "fault": ("plan", "FILE"),
           "scenario": ("whatif", "FILE", "--out", "OUT")}


def prepare(case: Case, tmp_path: Path) -> tuple[list[str], str, Path]:
    """(argv, where the line must start, what must not be created)."""
    out = tmp_path / "out"
    if case.kind == "cli":
        run_dir = tmp_path / "run"
        run_dir.mkdir()
        (run_dir / "manifest.json").write_text('{"experiment": "bad"}')
        good = tmp_path / "good.yaml"  # FILE: a good experiment (run) or topology (probe): only the option is bad
        good.write_text(TOPOLOGY if case.argv[0] == "probe" or "--topology" in case.argv else EXPERIMENT)
        given = {RUN_DIR: str(run_dir), "FILE": str(good), "OUT": str(out)}
        argv = [given.get(arg, arg) for arg in case.argv]
        return argv, f"{case.field}: ", out
    good = GOOD[case.kind]
    if isinstance(case.edit, tuple):
        old, new = case.edit
        assert good.count(old) == 1, (old, "must occur once in the good file")
        text = good.replace(old, new)
    else:
        text = case.edit or ""
    path = tmp_path / f"{case.kind}.yaml"
    path.write_text(text)
    argv = [str(path) if arg == "FILE" else str(out) if arg == "OUT" else arg for arg in COMMAND[case.kind]]
    return argv, f"{path}: {case.field}: " if case.field else f"{path}: ", out


def assert_refused(case: Case, start: str, status: int, err: str) -> None:
    lines = err.strip().splitlines()
    assert status == 2, (status, err)
    assert len(lines) == 1, err
    line = lines[0].removeprefix("error: ")
    assert line.startswith(start), (start, line)
    assert case.needle in line, (case.needle, line)
    for phrase in PYTHON_OR_PYDANTIC:
        assert phrase not in line, (phrase, line)


@pytest.fixture
def own_prefix(state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A prefix nobody uses (nothing with it may exist after a refusal)."""
    import uuid

    value = f"tb-{uuid.uuid4().hex[:4]}-"
    monkeypatch.setenv("TESTBED_PREFIX", value)
    return value


def test_the_table_covers_every_kind_of_input():
    kinds = [case.kind for case in CASES.values()]
    assert len(CASES) >= 25 and {kind: kinds.count(kind) >= 4 for kind in GOOD} == dict.fromkeys(GOOD, True)
    assert kinds.count("cli") >= 4


@pytest.mark.parametrize("name", sorted(CASES), ids=sorted(CASES))
def test_a_malformed_input_is_refused_in_one_line_before_anything_is_built(name, tmp_path, state_dir, own_prefix):
    case = CASES[name]
    argv, start, out = prepare(case, tmp_path)
    outcome = CliRunner().invoke(app, argv)
    assert_refused(case, start, outcome.exit_code, outcome.stderr)
    assert outcome.stdout == ""
    assert not out.exists() and not state_dir.exists() and namespaces_with(own_prefix) == []


@pytest.mark.parametrize("name", AS_PROCESSES)
def test_the_command_refuses_in_one_line_on_its_stderr(name, tmp_path, state_dir, own_prefix):
    case = CASES[name]
    argv, start, out = prepare(case, tmp_path)
    proc = run_cli(*argv)
    assert_refused(case, start, proc.returncode, proc.stderr)
    assert not out.exists() and not state_dir.exists() and namespaces_with(own_prefix) == []


def test_each_case_is_one_edit_from_a_good_input(tmp_path, capsys):
    for kind, load in (("topology", load_topology), ("experiment", load_experiment), ("scenario", load_scenario)):
        path = tmp_path / f"{kind}.yaml"
        path.write_text(GOOD[kind])
        load(path)
    assert capsys.readouterr().err == ""  # nothing unusual in the good files either


def test_a_legal_but_unusual_delay_is_said_once_and_the_command_goes_on(tmp_path):
    path = tmp_path / "satellite.yaml"
    path.write_text(TOPOLOGY.replace("latency: 10ms", "latency: 250ms"))
    outcome = CliRunner().invoke(app, ["up", str(path), "--dry-run"])
    assert outcome.exit_code == 0, outcome.stderr
    assert outcome.stderr.splitlines() == [f"warning: {path}: links[0].latency: 250ms one way is more than any "
                                           "terrestrial path has (ITU-T G.114 plans one-way delay up to 150 ms; "
                                           "beyond it, satellite hops): going on"]
