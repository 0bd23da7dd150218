"""testbed.rankenv: what a rank is told survives to_env/from_env, the module needs only the standard library, and
TESTBED_* names are spelt in code (string literals that are not docstrings) only where this file allows."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import fields
from pathlib import Path

import pytest

from testbed import rankenv
from testbed.plan.network import build_plan
from testbed.rankenv import RankEnv
from testbed.runner.ranks import rank_layout
from testbed.spec.topology import load_topology
from testbed.workload.layout import layout_from_env
from tests.conftest import ROOT

# the modules that name the environment's variables
NAMING = {"testbed/rankenv.py", "testbed/settings.py"}
# modules that still spell a TESTBED_ name, and why; the test fails when one stops (so the list stays true)
EXCEPTIONS = {
    # an option's help text: spec imports nothing of testbed, testbed.rankenv included
    "testbed/spec/strategies.py": {"TESTBED_METRICS_DIR"},
}
SPELT = re.compile(r"TESTBED_[A-Z0-9_]*")


def a_value(field_type: str, index: int):
    """A value of `field_type` (RankEnv's annotation, a string) that differs from field to field."""
    kind = field_type.removesuffix(" | None")
    return {"str": f"value-{index}", "int": 10 + index, "float": 1.25 + index, "bool": index % 2 == 0,
            "tuple[int, ...]": (2, 1, index), "tuple[dict[str, Any], ...]": ({"rank": index, "step": 5},)}[kind]


def every_field_set() -> RankEnv:
    return RankEnv(**{field.name: a_value(field.type, i) for i, field in enumerate(fields(RankEnv))})


def test_every_field_comes_back_from_the_environment_it_writes():
    told = every_field_set()
    env = told.to_env()
    assert len(env) == len(fields(RankEnv))  # one variable a field, none shared
    assert all(isinstance(value, str) for value in env.values())
    assert RankEnv.from_env(env) == told
    assert RankEnv.from_env(told.to_env() | {"UNRELATED": "x"}) == told


def test_each_field_alone_and_nothing_at_all():
    assert RankEnv().to_env() == {} and RankEnv.from_env({}) == RankEnv()
    told = every_field_set()
    for field in fields(RankEnv):
        alone = RankEnv(**{field.name: getattr(told, field.name)})
        assert len(alone.to_env()) == 1 and RankEnv.from_env(alone.to_env()) == alone, field.name


def test_every_name_the_module_exports_is_a_field_s():
    names = {value for key, value in vars(rankenv).items() if key.isupper() and isinstance(value, str)
             and key != "PREFIX"}
    assert names == {rankenv.CODECS[field.name][0] for field in fields(RankEnv)}


def test_a_variable_that_cannot_be_read_is_named():
    with pytest.raises(ValueError, match=r"TESTBED_DC_SIZES='2,x'"):
        RankEnv.from_env({rankenv.DC_SIZES: "2,x"})
    with pytest.raises(ValueError, match=r"TESTBED_SDC="):
        RankEnv.from_env({rankenv.SDC: "[not json"})


def test_what_the_runner_writes_the_workload_reads():
    topology = load_topology(ROOT / "topologies" / "asymmetric.yaml")
    specs = rank_layout(topology, build_plan(topology, "userspace-delay"), 2, Path("/m"), master_port=20001)
    for spec in specs:
        told = RankEnv.from_env(spec.env)
        layout = layout_from_env(spec.env)
        assert (told.rank, told.dc, told.node, told.metrics_dir) == (spec.rank, layout.dc, spec.node.name, "/m")
        assert told.dc_sizes == layout.dc_sizes and told.world_size == len(specs)


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return names | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}


@pytest.mark.parametrize("module", sorted(NAMING))
def test_the_names_need_nothing_but_the_standard_library(module):
    imported = {name.split(".")[0] for name in imports_of(ROOT / module)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def spelt_in_code(path: Path) -> set[str]:
    """TESTBED_* names in `path`'s string literals (f-strings' text included), docstrings and comments not."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    return {name for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings for name in SPELT.findall(node.value)}


def test_testbed_names_are_spelt_only_where_allowed():
    spelt = {path.relative_to(ROOT).as_posix(): names for path in sorted((ROOT / "testbed").rglob("*.py"))
             if (names := spelt_in_code(path))}
    outside = {module: names for module, names in spelt.items() if module not in NAMING}
    assert outside == EXCEPTIONS
    assert set(NAMING) <= set(spelt)


def test_the_check_sees_a_spelt_name(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""Reads $TESTBED_DOC."""\n# TESTBED_COMMENT\nX = f"{1}TESTBED_SEEN"\n')
    assert spelt_in_code(module) == {"TESTBED_SEEN"}

