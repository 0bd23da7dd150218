"""The documentation's generated pages (docs/hooks.py): built from the code, complete, and in the site's nav."""

import importlib.util
import re
from pathlib import Path

import yaml

from tests.conftest import ROOT


def _hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_command_and_option_is_in_the_reference():
    import click
    import typer

    from testbed.cli.commands import app

    page = _hooks().cli_page()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        assert f"## testbed {name} " in page
        for param in command.get_params(click.Context(command)):
            if getattr(param, "hidden", False):  # kept for old scripts, not offered
                continue
            for opt in param.opts:
                if opt.startswith("-"):
                    assert f"`{opt}" in page or f", {opt}" in page or f"/{opt}" in page, f"testbed {name} {opt}"


def test_every_environment_variable_the_code_reads_is_described():
    hooks = _hooks()
    commented = {name for name, (_, comment) in hooks.named_in_code().items() if comment}
    undescribed = sorted(hooks.code_environment() - set(hooks.ENVIRONMENT) - commented)
    assert not undescribed, f"give these a comment in testbed/settings.py or testbed/rankenv.py: {undescribed}"
    page = hooks.environment_page()
    assert all(f"| `{name}` |" in page for name in hooks.code_environment())


def test_formats_and_strategies_come_from_the_models():
    from testbed.spec.strategies import OPTIONS, STRATEGIES
    from testbed.spec.topology import Topology

    hooks = _hooks()
    formats = hooks.formats_page()
    for field in Topology.model_fields:
        assert f"| `{field}` |" in formats
    assert "## Units" in formats and "`1gbit`" in formats  # testbed.spec.units' own table
    # a unit field is described as the text a file holds (`latency: 20ms`), not as the number it becomes
    assert "| `latency` | duration (`20ms`) or none |" in formats and "| `bandwidth` | rate (`1gbit`) or none |" in formats
    strategies = hooks.strategies_page()
    assert all(f"`{name}`" in strategies for name in STRATEGIES)
    assert all(f"`{o.name}`" in strategies for o in OPTIONS.values() if o.place != "harness")


def test_every_shipped_file_has_a_gallery_page(tmp_path: Path):
    hooks = _hooks()
    pages = hooks.pages(tmp_path)
    shipped = [*ROOT.glob("experiments/*.yaml"), *ROOT.glob("scenarios/*.yaml")]
    assert shipped and all(f"gallery/{p.stem}.md" in pages for p in shipped)
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    assert hooks.on_config({"nav": nav})  # the Gallery section is filled from the same list
    gallery = next(e["Gallery"] for e in nav if isinstance(e, dict) and "Gallery" in e)
    assert {next(iter(e.values())) for e in gallery[1:]} == {f"gallery/{p.stem}.md" for p in shipped}


def test_a_kept_result_says_when_where_and_at_which_commit():
    for result in (ROOT / "docs" / "gallery" / "results").glob("*.md"):
        match = re.match(r"^---\n(.*?)\n---\n", result.read_text(), re.S)
        assert match, f"{result.name}: front matter with date, machine and commit"
        meta = yaml.safe_load(match.group(1))
        assert {"date", "machine", "commit"} <= set(meta), result.name
        assert (ROOT / "experiments" / result.name.replace(".md", ".yaml")).exists() or \
            (ROOT / "scenarios" / result.name.replace(".md", ".yaml")).exists(), f"{result.name}: no such file shipped"


def test_no_page_is_both_generated_and_written_by_hand(tmp_path: Path):
    written = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert not written & set(_hooks().pages(tmp_path))
