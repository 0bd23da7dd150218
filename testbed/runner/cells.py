"""The cells of an experiment: expanded by the plan (testbed.plan.cells, pure), run here."""

from testbed.plan.cells import UNSHAPED, Cell, base_links, plan_cells, point_label

__all__ = ["UNSHAPED", "Cell", "base_links", "plan_cells", "point_label"]
