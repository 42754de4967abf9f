"""Every relative link in README.md and docs/ resolves: the file (or folder) exists, and a
``#anchor`` into a Markdown file names one of its headings as GitHub slugs them.

The README is a front page whose detail lives under docs/, so a moved or renamed doc, or a
renamed heading, would otherwise leave dead links behind silently."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _prose(text: str) -> str:
    """The text with fenced blocks and code spans blanked: a link there is not a link."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text
    text = text.replace("`", "").strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def dead_links(path: Path) -> list[str]:
    """The links of ``path`` that do not resolve, each as ``target: why``."""
    dead = []
    for target in LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            dead.append(f"{target}: {resolved} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            dead.append(f"{target}: no heading #{anchor} in {resolved.name}")
    return dead


@pytest.mark.parametrize("path", docs(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert dead_links(path) == []


def test_the_docs_index_lists_every_doc():
    index = ROOT / "docs" / "README.md"
    linked = {(index.parent / t.partition("#")[0]).resolve()
              for t in LINK.findall(_prose(index.read_text(encoding="utf-8")))}
    for doc in sorted((ROOT / "docs").glob("*.md")):
        if doc != index:
            assert doc.resolve() in linked, f"{doc.name} is not listed in docs/README.md"
    assert (ROOT / "docs" / "runbooks").resolve() in linked


def test_a_dead_link_and_a_dead_anchor_are_found(tmp_path):
    (tmp_path / "other.md").write_text("# A heading, with `code`\n\n## Twice\n\n## Twice\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](other.md) [ok](other.md#a-heading-with-code) [ok](other.md#twice-1)\n"
        "[gone](missing.md) [bad anchor](other.md#nowhere) [web](https://example.org/x)\n"
        "`[not a link](nowhere.md)`\n\n```\n[nor this](nowhere.md)\n```\n")
    dead = dead_links(doc)
    assert [d.split(":")[0] for d in dead] == ["missing.md", "other.md#nowhere"]
