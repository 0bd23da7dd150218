"""testbed.spec.strategies.STRATEGIES is the one list of strategy names: the workload's classes and the cost
model's predictors are checked against it here (every strategy has both, neither has an extra), each sits in
the module of its spec family, and every other list of strategy names is a subset of it."""

from __future__ import annotations

import pytest

from testbed.spec import experiment
from testbed.spec.strategies import DILOCO, DP, PP, STRATEGIES, TORCH_NATIVE, TORCHFT

# a spec family -> its module, the same name in testbed.workload.strategies and testbed.model.strategies
FAMILIES = {"dp": DP, "pipeline": PP, "diloco": DILOCO, "torch_native": TORCH_NATIVE, "torchft": TORCHFT}


def _family(name: str) -> str:
    return next(module for module, names in FAMILIES.items() if name in names)


def test_the_spec_families_cover_every_strategy_once():
    listed = [name for names in FAMILIES.values() for name in names]
    assert sorted(listed) == sorted(STRATEGIES)


def test_every_strategy_has_a_cost_model_in_its_familys_module_and_no_other_has():
    from testbed.model.strategies import PREDICTORS

    assert set(PREDICTORS) == set(STRATEGIES)
    for name, function in PREDICTORS.items():
        assert function.__module__ == f"testbed.model.strategies.{_family(name)}", name


def test_every_strategy_has_a_workload_class_in_its_familys_module_and_no_other_has():
    from testbed.workload.strategies import strategy_classes

    classes = strategy_classes()
    assert set(classes) == set(STRATEGIES)
    for name, cls in classes.items():
        assert cls.name == name
        assert cls.__module__ == f"testbed.workload.strategies.{_family(name)}", name


@pytest.mark.parametrize("table", ["RESTART_STRATEGIES", "SDC_STRATEGIES", "CHECKED_IN_BUCKETS"])
def test_the_specs_other_lists_of_strategies_name_only_strategies(table):
    assert set(getattr(experiment, table)) <= set(STRATEGIES)

