"""CI gates without running anything: thresholds, regressions against an earlier run, JUnit XML."""

import xml.etree.ElementTree as ET

import pandas as pd
import pytest

from testbed.collect.gates import check_thresholds, regressions, write_junit

EXPERIMENT = """name: g
topology: {name: t, dcs: [{name: a, nodes: 1}, {name: b, nodes: 1}], links: [{between: [a, b]}]}
strategies: [flat-dp, hier-dp]
sweep:
  links[a,b].latency: [1ms, 20ms]
thresholds:
  - {claim: "hier-dp is faster at 20 ms", metric: tokens_per_s, strategy: hier-dp, than: flat-dp,
     where: {latency: 20ms}, min: 1.0}
  - {metric: tokens_per_s, strategy: flat-dp, where: {latency: 1ms}, max: 50}
"""


def points(flat_20ms: float = 80.0, hier_20ms: float = 100.0, bytes_hier: float = 0.5) -> pd.DataFrame:
    rows = []
    for strategy, at_1ms, at_20ms, gb in (("flat-dp", 120.0, flat_20ms, 1.0), ("hier-dp", 110.0, hier_20ms, bytes_hier)):
        rows.append({"strategy": strategy, "baseline": "True", "links[a,b].latency": "baseline", "tokens_per_s": 125.0,
                     "inter_dc_gb_per_step": gb})
        rows.append({"strategy": strategy, "baseline": "False", "links[a,b].latency": "1ms", "tokens_per_s": at_1ms,
                     "inter_dc_gb_per_step": gb})
        rows.append({"strategy": strategy, "baseline": "False", "links[a,b].latency": "20ms", "tokens_per_s": at_20ms,
                     "inter_dc_gb_per_step": gb})
    return pd.DataFrame(rows)


def test_thresholds_compare_the_named_cells():
    checks = check_thresholds({"experiment_text": EXPERIMENT}, points())
    assert [c["passed"] for c in checks] == [True, False]
    assert checks[0]["value"] == pytest.approx(100 / 80) and checks[1]["value"] == pytest.approx(120)
    slower = check_thresholds({"experiment_text": EXPERIMENT}, points(hier_20ms=60.0))
    assert not slower[0]["passed"] and slower[0]["value"] == pytest.approx(60 / 80)
    gone = check_thresholds({"experiment_text": EXPERIMENT}, points().query("strategy == 'flat-dp'"))
    assert not gone[0]["passed"] and gone[0]["value"] is None and "no completed cell" in gone[0]["why"]


def test_regressions_against_an_earlier_run():
    before = points()
    same = regressions(points(), before, 0.05)
    assert same and all(item["passed"] for item in same) and len(same) == 2 * 3 * 2
    slower = regressions(points(hier_20ms=94.0), before, 0.05)  # -6 %
    failed = [item for item in slower if not item["passed"]]
    assert len(failed) == 1 and failed[0]["metric"] == "tokens_per_s" and "hier-dp" in failed[0]["point"]
    assert failed[0]["change"] == pytest.approx(-0.06) and "fell by 6.0%" in failed[0]["why"]
    assert all(item["passed"] for item in regressions(points(hier_20ms=96.0), before, 0.05))  # -4 %: noise
    more_bytes = [i for i in regressions(points(bytes_hier=0.6), before, 0.05) if not i["passed"]]
    assert {i["metric"] for i in more_bytes} == {"inter_dc_gb_per_step"} and len(more_bytes) == 3
    missing = regressions(points().query("strategy == 'flat-dp'"), before, 0.05)
    assert [i["passed"] for i in missing if "hier-dp" in i["point"]] == [False] * 6


def test_junit_has_one_case_per_threshold_with_value_and_bound(tmp_path):
    checks = check_thresholds({"experiment_text": EXPERIMENT}, points())
    cells = [{"cell": {"id": "flat-dp__r0"}, "status": "ok", "reason": "", "seconds": 3.0},
             {"cell": {"id": "hier-dp__r0"}, "status": "failed", "reason": "rank 1 on b-0 died (exit code 3)",
              "log_tail": ["Traceback", "boom"], "seconds": 1.5}]
    regressed = regressions(points(hier_20ms=50.0), points(), 0.05)
    path = tmp_path / "junit.xml"
    write_junit(path, "g", cells, checks, regressed, "results/g/old")
    root = ET.parse(path).getroot()
    suites = {s.get("name"): s for s in root.iter("testsuite")}
    assert set(suites) == {"g.cells", "g.thresholds", "g.regression"}
    thresholds = suites["g.thresholds"].findall("testcase")
    assert [c.get("name") for c in thresholds] == [
        "hier-dp is faster at 20 ms", "tokens_per_s of flat-dp at latency=1ms <= 50.0"]
    assert thresholds[0].find("failure") is None
    failure = thresholds[1].find("failure")
    assert failure.get("message") == "measured 120, bound <= 50.0"
    cell = suites["g.cells"].findall("testcase")[1]
    assert cell.find("failure").get("message") == "rank 1 on b-0 died (exit code 3)" and "boom" in cell.find("failure").text
    assert suites["g.regression"].get("failures") == "1"
    assert root.get("tests") == str(2 + 2 + 12) and root.get("failures") == str(1 + 1 + 1)
