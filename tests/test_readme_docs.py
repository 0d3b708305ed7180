"""The README is the manual, docs/ the reference: the README's probe recipe is CONTRIBUTING.md's
(which tests/test_recipe_task.py runs word for word), every page of docs/ is linked from the
README exactly once, and every relative link in the README, CONTRIBUTING.md and docs/ points at
a file that exists (the pages moved out of the README kept links written from the root)."""
import re
from pathlib import Path
from urllib.parse import unquote

from helpers import REPO

LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"```.*?```", re.S)


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def section(text: str, title: str) -> str:
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_readme_probe_recipe_is_contributings():
    readme = section((REPO / "README.md").read_text(), "Your own probe")
    recipe = section((REPO / "CONTRIBUTING.md").read_text(), "Add a task")
    for lang in ("yaml", "python"):
        assert blocks(readme, lang) == blocks(recipe, lang), lang


def test_every_docs_page_is_linked_once_from_the_readme():
    links = [target.split("#")[0] for target in LINK.findall(
        FENCE.sub("", (REPO / "README.md").read_text()))]
    pages = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md"))
    assert pages, "docs/ has no pages"
    assert {p: links.count(p) for p in pages} == {p: 1 for p in pages}


def anchors(md: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation but '-' dropped, spaces to '-'."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", md.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def test_relative_links_and_anchors_resolve():
    files = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
    broken = []
    for f in files:
        for target in LINK.findall(FENCE.sub("", f.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = unquote(target).partition("#")
            dest = f.parent / path if path else f
            if not dest.exists() or (anchor and dest.suffix == ".md"
                                     and anchor not in anchors(dest)):
                broken.append(f"{f.relative_to(REPO)}: {target}")
    assert not broken, broken
