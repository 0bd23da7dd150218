"""`testbed emulate`: a scenario's scale model, derived (testbed.model.scale_model, pure), run (testbed.runner.emulate,
root) and reported (testbed.collect.emulate: emulate.csv, emulate.md); or, dry, the cells it would run group by
group beside the full scale."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.api.errors import UserError, user_errors

if TYPE_CHECKING:
    from testbed.fabric.backend import Backend

POINTS = ("reference", "distance", "bandwidth", "all")


def _points(points: str) -> str:
    if points not in POINTS:
        raise UserError(f"--points: expected one of {', '.join(POINTS)}, got {points!r}", 2)
    return points


def _derive(derive: Any) -> Any:
    """The derivation to use: `derive` where given, else the model's (testbed.model.scale_model.derive)."""
    if derive is not None:
        return derive
    try:
        from testbed.model.scale_model import derive as model_derive
    except ImportError as error:
        raise UserError(f"testbed emulate: the scale model's derivation is not available ({error})", 1) from error
    return model_derive


def scale_rows(cells: list[Any]) -> list[dict[str, Any]]:
    """One row a (scale cell, group): the group's value at full scale and in the scale model, and why it is not
    matched where it is not; first, per cell, its two predictions (group `efficiency`)."""
    rows = []
    for cell in cells:
        at = {"strategy": cell.strategy, "kind": cell.kind, "distance_km": cell.distance_km,
              "bandwidth_gbit": cell.bandwidth_gbit}
        rows.append({**at, "group": "efficiency", "full_scale": cell.efficiency_full_scale,
                     "scale_model": cell.efficiency_scale_model_predicted, "unmatched": ""})
        for group, full in cell.groups_full.items():
            rows.append({**at, "group": group, "full_scale": full, "scale_model": cell.groups_scale.get(group),
                         "unmatched": cell.unmatched.get(group, "")})
        for group, why in cell.unmatched.items():
            if group not in cell.groups_full:
                rows.append({**at, "group": group, "full_scale": None, "scale_model": None, "unmatched": why})
    return rows


def emulate_dry_run(scenario: Path, points: str = "distance", derive: Any = None) -> list[dict[str, Any]]:
    """The scale model `testbed emulate` would run at `points`, group by group beside the full scale (no root)."""
    from testbed.spec.scenario import load_scenario

    with user_errors():
        chosen, loaded = _points(points), load_scenario(scenario)
        return scale_rows(_derive(derive)(loaded, chosen))


def emulate(scenario: Path, out_dir: Path = Path("results"), *, points: str = "distance",
            prefix: str | None = None, shaper: str = "auto", backend: str | Backend = "netns",
            launcher: str = "auto", resume: bool = False, progress: Any = None, derive: Any = None) -> dict[str, Any]:
    """Run the scenario's scale model at `points` under `out_dir`/<scenario>-emulate/<run> and report it: the run
    directory, emulate.csv's and the report's paths and its rows. A full disk is a UserError (exit 1)."""
    from testbed.collect.emulate import CSV, build, table
    from testbed.runner.emulate import run_emulate
    from testbed.runner.space import OutOfSpace

    try:
        with user_errors():
            chosen = _points(points)
            run_dir = run_emulate(scenario, out_dir, points=chosen, prefix=prefix, shaper=shaper,
                                  backend=backend, launcher=launcher, resume=resume, progress=progress,
                                  derive=_derive(derive))
            report = build(run_dir)
    except OutOfSpace as error:
        raise UserError(str(error), 1) from error
    return {"run_dir": run_dir, "csv": run_dir / CSV, "report": report,
            "rows": table(run_dir).to_dict(orient="records")}
