"""Gates for CI: the experiment's thresholds, regressions against an earlier run of the same experiment,
and both (with every cell's outcome) as JUnit XML, which CI systems show as test results."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pandas as pd

from testbed.spec.experiment import Experiment, resolve_where

# figure -> +1 when higher is better, -1 when lower is; compared when both runs have it
REGRESSION_METRICS = {"tokens_per_s": +1, "inter_dc_gb_per_step": -1}
COMMAND_METRICS = {"cell_s": -1, "inter_dc_bytes_kernel": -1}  # runs without step metrics (your own command)


def sweep_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.startswith(("links[", "workload."))]


def check_thresholds(manifest: dict, agg: pd.DataFrame) -> list[dict]:
    """Evaluate the experiment's thresholds against the aggregated cells (sweep values compared as text)."""
    import yaml

    experiment = Experiment.model_validate(yaml.safe_load(manifest["experiment_text"]), context={"si": True})
    results = []
    for threshold in experiment.thresholds:
        rows = agg[agg["baseline"] == "False"] if not agg.empty else agg
        for key, value in threshold.where.items():
            try:
                column = resolve_where(key, sweep_columns(rows))
            except ValueError:
                rows = rows.iloc[0:0]
                continue
            rows = rows[rows[column] == str(value)]
        mine = rows[rows["strategy"] == threshold.strategy] if threshold.strategy else rows
        result = {"threshold": threshold.model_dump(), "value": None, "passed": False, "why": ""}
        results.append(result)
        if mine.empty or threshold.metric not in mine or mine[threshold.metric].isna().all():
            result["why"] = "no completed cell matches"
            continue
        value = float(mine[threshold.metric].median())
        if threshold.than:
            other = rows[rows["strategy"] == threshold.than]
            if other.empty or other[threshold.metric].isna().all():
                result["why"] = f"no completed cell of {threshold.than} matches"
                continue
            value = value / float(other[threshold.metric].median())
        result["value"] = value
        result["passed"] = (threshold.min is None or value >= threshold.min) and \
                           (threshold.max is None or value <= threshold.max)
    return results


def bound_of(t: dict) -> str:
    return " and ".join(x for x in (f">= {t['min']}" if t["min"] is not None else "",
                                     f"<= {t['max']}" if t["max"] is not None else "") if x)


def describe_threshold(t: dict) -> str:
    subject = f"{t['metric']} of {t['strategy'] or 'every strategy'}"
    if t.get("than"):
        subject += f" / {t['than']}"
    where = ", ".join(f"{k}={v}" for k, v in t["where"].items())
    return f"{subject}{' at ' + where if where else ''} {bound_of(t)}"


def check_line(check: dict) -> str:
    verdict = "PASS" if check["passed"] else "FAIL"
    value = "n/a" if check["value"] is None else f"{check['value']:.3g}"
    claim = check["threshold"].get("claim")
    why = f" ({check['why']})" if check["why"] else ""
    return f"{verdict}: {(claim + ' — ') if claim else ''}{describe_threshold(check['threshold'])}: measured {value}{why}"


# --- regressions --------------------------------------------------------------------------------------------
def _point_name(row: pd.Series, keys: list[str]) -> str:
    where = "single site" if row["baseline"] == "True" else ", ".join(f"{k}={row[k]}" for k in keys)
    return f"{row['strategy']} ({where})" if where else str(row["strategy"])


def regressions(current: pd.DataFrame, previous: pd.DataFrame, tolerance: float) -> list[dict]:
    """Each figure of each (strategy, sweep point) of `previous` against `current`: a regression when it is
    worse by more than `tolerance` (a fraction), or missing from `current`."""
    if previous.empty:
        return []
    metrics = REGRESSION_METRICS if "tokens_per_s" in previous else COMMAND_METRICS
    key_columns = ["strategy", "baseline", *sweep_columns(previous)] if "tokens_per_s" in previous else ["cell"]
    if "tokens_per_s" not in previous:  # one row per cell: compare completed ones
        previous = previous[previous["status"] == "ok"]
        current = current[current["status"] == "ok"] if not current.empty else current
    out = []
    for _, before in previous.iterrows():
        name = _point_name(before, sweep_columns(previous)) if "tokens_per_s" in previous else str(before["cell"])
        match = current
        for key in key_columns:
            match = match[match[key].astype(str) == str(before[key])] if key in match else match.iloc[0:0]
        for metric, sign in metrics.items():
            old = before.get(metric)
            if old is None or (isinstance(old, float) and math.isnan(old)) or old == 0:
                continue
            item = {"point": name, "metric": metric, "before": float(old), "after": None, "change": None,
                    "passed": False, "why": ""}
            out.append(item)
            if match.empty or metric not in match or match[metric].isna().all():
                item["why"] = "not measured in this run (the cell failed or is gone)"
                continue
            new = float(match[metric].iloc[0])
            item["after"], item["change"] = new, new / float(old) - 1
            worse = -item["change"] * sign
            item["passed"] = worse <= tolerance
            if not item["passed"]:
                item["why"] = f"{'fell' if sign > 0 else 'rose'} by {abs(item['change']):.1%} (tolerance {tolerance:.0%})"
    return out


def regression_line(item: dict) -> str:
    verdict = "PASS" if item["passed"] else "FAIL"
    before = f"{item['before']:.4g}"
    after = "n/a" if item["after"] is None else f"{item['after']:.4g}"
    change = "" if item["change"] is None else f" ({item['change']:+.1%})"
    why = f": {item['why']}" if item["why"] else ""
    return f"{verdict}: {item['metric']} of {item['point']}: {before} -> {after}{change}{why}"


# --- JUnit ----------------------------------------------------------------------------------------------------
def _suite(root: ET.Element, name: str) -> ET.Element:
    return ET.SubElement(root, "testsuite", name=name)


def _case(suite: ET.Element, classname: str, name: str, passed: bool, message: str, text: str,
          properties: dict[str, Any] | None = None, seconds: float = 0.0) -> None:
    case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.1f}")
    if properties:
        props = ET.SubElement(case, "properties")
        for key, value in properties.items():
            ET.SubElement(props, "property", name=key, value=str(value))
    if not passed:
        failure = ET.SubElement(case, "failure", message=message, type="testbed")
        failure.text = text
    ET.SubElement(case, "system-out").text = text


def write_junit(path: Path, experiment: str, cells: list[dict], checks: list[dict],
                regressed: list[dict] | None = None, against: str | None = None) -> None:
    """JUnit XML: a suite of the cells (one case each), one of the thresholds (the claim as name, measured
    value and bound in the message) and, with `against`, one of the regression comparisons."""
    root = ET.Element("testsuites", name=f"testbed {experiment}")
    suite = _suite(root, f"{experiment}.cells")
    for cell in cells:
        ok = cell["status"] == "ok"
        tail = "\n".join(cell.get("log_tail") or [])
        _case(suite, f"{experiment}.cells", cell["cell"]["id"], ok, "" if ok else cell["reason"],
              ("ok" if ok else f"{cell['reason']}\n{tail}").strip(), seconds=cell.get("seconds") or 0.0)
    suite = _suite(root, f"{experiment}.thresholds")
    for check in checks:
        t = check["threshold"]
        value = "n/a" if check["value"] is None else f"{check['value']:.4g}"
        message = f"measured {value}, bound {bound_of(t)}" + (f" ({check['why']})" if check["why"] else "")
        _case(suite, f"{experiment}.thresholds", t.get("claim") or describe_threshold(t), check["passed"], message,
              check_line(check), {"metric": t["metric"], "measured": value, "bound": bound_of(t)})
    if against is not None:
        suite = _suite(root, f"{experiment}.regression")
        for item in regressed or []:
            _case(suite, f"{experiment}.regression", f"{item['metric']} of {item['point']}", item["passed"],
                  regression_line(item), regression_line(item),
                  {"before": item["before"], "after": item["after"], "against": against})
    total = failures = 0
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        failed = sum(1 for c in cases if c.find("failure") is not None)
        suite.set("tests", str(len(cases)))
        suite.set("failures", str(failed))
        suite.set("errors", "0")
        total, failures = total + len(cases), failures + failed
    root.set("tests", str(total))
    root.set("failures", str(failures))
    ET.indent(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)

