"""The documentation's own links: every relative link in the README and the pages under docs/ and benchmarks/
names a file that exists and, with a #fragment into a Markdown file, one of that file's headings.

The pages cross-reference each other by section (docs/fit.md alone has hundreds of such links); a heading
renamed or a section moved must not leave a reader at the top of a long page. Anchors follow GitHub's rule:
the heading's text lower-cased, every character but letters, digits, spaces, hyphens and underscores dropped,
spaces made hyphens, and a repeated heading numbered -1, -2, ...
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "benchmarks").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    return re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower()).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(page: Path) -> frozenset[str]:
    """The anchors of a Markdown page's headings, outside fenced code (read once per page)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        match = None if fenced else HEADING.match(line)
        if match:
            name = anchor(match.group(1))
            found.add(name if name not in seen else f"{name}-{seen[name]}")
            seen[name] = seen.get(name, 0) + 1
    return frozenset(found)


def broken_links(page: Path) -> list[str]:
    """The page's relative links that name no file, or no heading of the Markdown file they point into."""
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file):
            broken.append(f"{target} (no such heading)")
    return broken


def test_anchors_follow_githubs_rule():
    assert anchor("Where the collectives' time goes, op by op (fifty-first session)") == \
        "where-the-collectives-time-goes-op-by-op-fifty-first-session"
    assert anchor("`twin fit`: measure one node") == "twin-fit-measure-one-node"


def test_a_repeated_heading_is_numbered(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n[up](#notes-1) [gone](#notes-2)\n")
    assert anchors(page) == {"a", "notes", "notes-1"}
    assert broken_links(page) == ["#notes-2 (no such heading)"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []
