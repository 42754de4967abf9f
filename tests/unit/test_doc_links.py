"""Every relative link in README.md and docs/ resolves: the file (or folder) exists, and a
``#anchor`` into a Markdown file names one of its headings as GitHub slugs them. And every
repository path a Markdown file of the repository cites in backticks exists.

The README is a front page whose detail lives under docs/, so a moved or renamed doc, or a
renamed heading, would otherwise leave dead links behind silently; and the docs cite code,
scripts and result files by path, which move and go."""

from __future__ import annotations

import glob
import os
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


def markdown_files(root: Path = ROOT) -> list[Path]:
    """Every Markdown file of the repository: README.md, docs/, each folder's README or
    schema. Hidden folders (.venv, .git) and build output (*.egg-info) hold none of ours."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if not _not_ours(d)]  # not walked at all
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


def _not_ours(folder: str) -> bool:
    return folder.startswith(".") or folder.endswith(".egg-info")


def _top_folders(root: Path) -> list[str]:
    """The repository's top-level folders: a backticked name starting with one is a path."""
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and re.fullmatch(r"[a-z_]+", p.name))


def _expand(pattern: str) -> list[str]:
    """``a_{x,y}.json`` -> ``a_x.json``, ``a_y.json``, as the docs abbreviate sibling files."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [q for alt in m.group(1).split(",")
            for q in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def dangling_paths(path: Path, root: Path = ROOT) -> list[str]:
    """The repository paths ``path`` cites in backticks that name nothing, as ``line: path``.

    A code span that starts with a top-level folder (`` `kvscope/sim/faults.py` ``) is a
    path; what follows a space is not (`` `plan_verify.py rejudge` `` cites the script).
    Braces name each alternative, each of which must exist; a ``*`` must match something."""
    folders = "|".join(_top_folders(root))
    cited = re.compile(r"`((?:" + folders + r")/[A-Za-z0-9_./*{},-]+)")
    dead = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in cited.finditer(line):
            p = m.group(1).rstrip(".,)")
            for each in _expand(p):
                if not (glob.glob(str(root / each)) if "*" in each else (root / each).exists()):
                    dead.append(f"{n}: {each}")
    return dead


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_cited_repository_path_exists(path):
    assert dangling_paths(path) == []


def test_the_markdown_files_include_the_front_page_the_docs_and_the_schema():
    found = {p.relative_to(ROOT).as_posix() for p in markdown_files()}
    assert {"README.md", "docs/architecture.md", "docs/runbooks/KVOffloadTierDataLost.md",
            "diagnostics/SCHEMA.md"} <= found


def test_a_missing_cited_path_is_found(tmp_path):
    (tmp_path / "kvscope" / "sim").mkdir(parents=True)
    (tmp_path / "kvscope" / "sim" / "faults.py").write_text("")
    (tmp_path / "kvscope" / "sim" / "soak.py").write_text("")
    (tmp_path / "kvscope.egg-info").mkdir()
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "x.md").write_text("`kvscope/gone.py`\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "`kvscope/sim/faults.py`, `kvscope/sim/` and `kvscope/sim/faults.py run`.\n"
        "`kvscope/sim/{faults,soak}.py` `kvscope/sim/so*.py` `vllm/gone.py` `/dev/shm/gone`\n"
        "`kvscope/connector/faults.py`\n"
        "`kvscope/sim/{soak,teacher_forced}.py` `kvscope/sim/lookup_*.py`).\n")
    assert dangling_paths(doc, tmp_path) == [
        "3: kvscope/connector/faults.py", "4: kvscope/sim/teacher_forced.py",
        "4: kvscope/sim/lookup_*.py"]
    assert markdown_files(tmp_path) == [doc]
