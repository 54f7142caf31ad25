"""The README and docs/ link to each other and to the repository without a dead link:
every relative link names a file that exists, and every #anchor a heading of its file
(as GitHub writes heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]+\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    out = set()
    for h in re.findall(r"^#{1,6} (.+)$", text, re.M):
        out.add(re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-"))
    return out


def test_every_relative_link_and_anchor_resolves():
    dead = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, frag = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                dead.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                dead.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not dead, "\n".join(dead)


def test_the_readme_is_a_landing_page():
    """A few screens: what it is, the two commands, the answer, a picture, where to read more."""
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for page in ("docs/cli.md", "docs/gpu.md", "docs/model.md", "docs/reports.md"):
        assert f"({page}" in text, page
