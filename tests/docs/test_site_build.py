"""CI's documentation line (scripts/build-docs) fails on a dead link, and the Changelog page's links lead somewhere
on the site as they do on GitHub."""

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.conftest import ROOT
from tests.docs.test_docs import _hooks

BUILD = ROOT / "scripts" / "build-docs"


def _site_copy(tmp_path: Path) -> Path:
    """A copy of docs/ with a config beside it that builds it with the real hooks: the tree CI builds, movable."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("hooks.py", "__pycache__"))
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"] = str(docs)
    config["hooks"] = [str(ROOT / "docs" / "hooks.py")]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _build(config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(BUILD), str(config)], capture_output=True, text=True, timeout=300)


def test_a_dead_link_fails_the_documentation_build_and_the_tree_as_it_is_passes(tmp_path: Path):
    config = _site_copy(tmp_path)
    clean = _build(config)
    assert clean.returncode == 0, clean.stderr
    index = tmp_path / "docs" / "index.md"
    index.write_text(index.read_text() + "\n[a page that is not there](concepts/no-such-page.md)\n")
    broken = _build(config)
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stderr, broken.stderr


def test_the_changelog_page_links_resolve_on_the_site_and_in_the_repository():
    page = _hooks().changelog_page()
    source = (ROOT / "CHANGELOG.md").read_text()
    site_links = re.findall(r"\]\((?!https?:|mailto:|#)([^)\s#]+)", page)
    repo_links = re.findall(r"\]\((?!https?:|mailto:|#)([^)\s#]+)", source)
    assert len(site_links) == len(repo_links)
    for link in repo_links:  # GitHub shows CHANGELOG.md from the repository root
        assert (ROOT / link).exists(), link
    for link in site_links:  # the site serves the page from docs/
        assert (ROOT / "docs" / link).exists(), link
