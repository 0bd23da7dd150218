"""The report as a person opens it: report.html of a real run (the session's netns quickstart, tests/conftest.py)
rendered by headless Chromium at a desktop's and a half screen's width. Every image loads, no table reaches past
the page unless it scrolls by itself (the page never scrolls sideways), and the Reading is the first thing under
the title. A screenshot of the whole page is kept with the test's output (its path printed)."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

from tests.needs import unavailable

WIDTHS = (1280, 800)  # a desktop window, half a laptop's screen
CHECK = """
window.addEventListener("load", () => {
  const width = document.documentElement.clientWidth;
  const scroller = (element) => {
    for (let e = element; e && e !== document.body; e = e.parentElement) {
      const overflow = getComputedStyle(e).overflowX;
      if (overflow === "auto" || overflow === "scroll") return e;
    }
    return null;
  };
  const tables = [...document.querySelectorAll("table")].map((table) => {
    const own = scroller(table), box = (own || table).getBoundingClientRect();
    return {heading: (table.previousElementSibling || {}).textContent || "", left: box.left, right: box.right,
            wider: table.scrollWidth > table.clientWidth + 1, scrolls: own !== null};
  });
  const title = document.querySelector("h1"), next = title && title.nextElementSibling;
  const out = {width, page_width: document.documentElement.scrollWidth, height: document.documentElement.scrollHeight,
               images: [...document.images].map((i) => ({src: i.getAttribute("src"), loaded: i.complete && i.naturalWidth > 0})),
               tables, after_title: next ? {tag: next.tagName, text: next.textContent.trim()} : null};
  const pre = document.createElement("pre");
  pre.id = "layout-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
"""


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    unavailable("no chromium (scripts/setup --tests installs it: apt-get install --no-install-recommends chromium)")
    raise AssertionError("unreachable")


def headless(browser: str, profile: Path, width: int, height: int, *args: str) -> subprocess.CompletedProcess:
    """Chromium, headless, as root (no sandbox), on a profile of its own, the window `width` x `height`."""
    return subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={profile}", f"--window-size={width},{height}", *args],
                          capture_output=True, text=True, timeout=120)


def layout(browser: str, page: Path, profile: Path, width: int) -> dict:
    """What CHECK found in `page` once loaded, at `width` pixels."""
    proc = headless(browser, profile, width, 900, "--virtual-time-budget=10000", "--dump-dom", page.as_uri())
    found = re.search(r'<pre id="layout-check">(.*?)</pre>', proc.stdout, re.S)
    assert found, f"{browser} --dump-dom gave no result ({proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(html.unescape(found.group(1)))


def test_the_quickstart_report_reads_in_a_browser(netns_quickstart, tmp_path):
    browser = chromium()
    run_dir = netns_quickstart.run_dir
    assert run_dir is not None, netns_quickstart.proc.stderr[-3000:]
    page = tmp_path / "report"  # a copy: the session's run stays as the run wrote it
    page.mkdir()
    shutil.copy(run_dir / "report.html", page / "report.html")
    shutil.copytree(run_dir / "plots", page / "plots")
    text = (page / "report.html").read_text()
    (page / "checked.html").write_text(text.replace("</body>", f"<script>{CHECK}</script></body>"))
    for width in WIDTHS:
        seen = layout(browser, page / "checked.html", tmp_path / "profile", width)
        assert seen["images"] and all(image["loaded"] for image in seen["images"]), (width, seen["images"])
        assert len(seen["images"]) == text.count("<img "), (width, seen["images"])
        assert seen["page_width"] <= seen["width"], f"at {width} px the page scrolls sideways: {seen}"
        for table in seen["tables"]:
            assert table["left"] >= 0 and table["right"] <= seen["width"] + 1, (width, table)
            assert not table["wider"] or table["scrolls"], (width, table)
        assert seen["after_title"] == {"tag": "H2", "text": "Reading"}, (width, seen["after_title"])
    screenshot = tmp_path / "report.png"
    height = min(seen["height"], 16000)  # the whole page (the last width's), in one image
    proc = headless(browser, tmp_path / "profile", WIDTHS[-1], height, f"--screenshot={screenshot}",
                    (page / "report.html").as_uri())
    assert screenshot.exists() and screenshot.stat().st_size > 10_000, proc.stderr[-2000:]
    print(f"screenshot of the report at {WIDTHS[-1]} px: {screenshot}")
