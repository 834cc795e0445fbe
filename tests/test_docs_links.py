"""The README stays short and every relative link in README.md and docs/ resolves.

A link's target file must exist (relative to the Markdown file that holds it); a `#fragment` must name
a heading of that file, with headings turned into anchors the way GitHub does. Links to other sites
(`https:`, `mailto:`) and links inside code are not checked.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 250

FENCE = re.compile(r"^(```|~~~)")
INLINE_CODE = re.compile(r"`[^`]*`")
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
AUTOLINK = re.compile(r"<(https?://[^>]+)>")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def prose_lines(path: Path):
    """(line number, text) of every line outside fenced code, with inline code removed."""
    in_fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        if not in_fence:
            yield number, INLINE_CODE.sub("", line)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = INLINE_CODE.sub(lambda m: m.group(0).strip("`"), heading.strip())
    text = re.sub(r"[*_]", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: dict[str, int] = {}
    out: set[str] = set()
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            in_fence = not in_fence
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match and not in_fence:
            anchor = github_anchor(match.group(1))
            count = found.get(anchor, 0)
            found[anchor] = count + 1
            out.add(anchor if count == 0 else f"{anchor}-{count}")
    return out


def relative_links(path: Path):
    for number, line in prose_lines(path):
        for target in LINK.findall(line):
            if not SCHEME.match(target):
                yield number, target


def broken_links(path: Path) -> list[str]:
    problems = []
    for number, target in relative_links(path):
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(ROOT)}:{number}: {target}"
        if not resolved.exists():
            problems.append(f"{where} (no such file)")
        elif fragment and resolved.is_file() and resolved.suffix == ".md" and fragment not in anchors(resolved):
            problems.append(f"{where} (no heading #{fragment})")
    return problems


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_docs_exist():
    for name in ("getting-started.md", "deployment.md", "security.md", "api.md", "architecture.md",
                 "glossary.md", "decisions/0001-config-and-core.md", "research/README.md"):
        assert (ROOT / "docs" / name).is_file(), name
    assert (ROOT / "CHANGELOG.md").is_file()


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    assert broken_links(path) == []


def test_every_docs_page_is_linked_from_the_readme_or_another_page():
    linked: set[Path] = set()
    for path in markdown_files():
        for _, target in relative_links(path):
            file_part = target.partition("#")[0]
            if file_part:
                linked.add((path.parent / file_part).resolve())
    orphans = [str(p.relative_to(ROOT)) for p in markdown_files()[1:] if p.resolve() not in linked]
    assert orphans == []


def test_checker_catches_a_broken_link_and_a_missing_heading(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A `code` heading: here\n", encoding="utf-8")
    page.write_text(
        "[ok](there.md#a-code-heading-here) [gone](missing.md) [bad](there.md#nowhere)\n"
        "[web](https://example.org/x) `[in code](nothing.md)`\n"
        "```\n[fenced](nothing.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == ["page.md:1: missing.md (no such file)", "page.md:1: there.md#nowhere (no heading #nowhere)"]
