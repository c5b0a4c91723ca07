"""Every relative link in README.md, docs/**/*.md and the emulator's manual (emulator/README.md and its pages
in emulator/docs/) resolves: to a file that exists and, with an ``#anchor``, to a heading of that file (or of
the same one), named the way GitHub names heading anchors. External links (any scheme, http(s) above all) are
not fetched. Code spans and fenced blocks are not prose: a link or heading written inside one does not count."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The syphon's manual and the emulator's (its README is the index of its pages in emulator/docs).
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")),
             ROOT / "emulator" / "README.md", *sorted((ROOT / "emulator" / "docs").rglob("*.md"))]

FENCED_BLOCK = re.compile(r"^ *(```|~~~).*?^ *\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.S)
HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", re.M)
# [text](target) and ![alt](target); the text may hold one level of brackets, the target a title.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose(markdown: str) -> str:
    """The text with fenced blocks removed, so their `#` comments are not headings."""
    return FENCED_BLOCK.sub("", markdown)


def anchor_of(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, every character but letters, digits, spaces, '-' and
    '_' dropped (backticks too), each space a '-'."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor; a repeated heading gets GitHub's '-1', '-2', ... suffixes."""
    seen: dict[str, int] = {}
    found = set()
    for heading in HEADING.findall(prose(markdown)):
        anchor = anchor_of(heading)
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def links(markdown: str) -> list[str]:
    """The targets of the links in the prose, in order (code spans and fenced blocks left out)."""
    return LINK.findall(CODE_SPAN.sub("", prose(markdown)))


def broken_links(document: Path, markdown: str) -> list[str]:
    """Each relative link of ``document`` (whose text is ``markdown``) that does not resolve, with why."""
    broken = []
    for target in links(markdown):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        linked = (document.parent / path).resolve() if path else document
        if path and not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(
                markdown if linked == document else linked.read_text()):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {linked.name}")
    return broken


def test_the_anchors_are_githubs():
    assert anchor_of("The status command: `--status`") == "the-status-command---status"
    assert anchor_of("Draining politely: `sink.max_messages_per_second` and ServerBusy") == \
        "draining-politely-sinkmax_messages_per_second-and-serverbusy"
    assert anchor_of("As a Databricks job (Asset Bundle)") == "as-a-databricks-job-asset-bundle"
    assert anchor_of("Where a run's time and CPU go") == "where-a-runs-time-and-cpu-go"
    assert anchors("# Tables\n## Tables\n```bash\n# not a heading\n```\n### Tables\n") == \
        {"tables", "tables-1", "tables-2"}


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Other page\n## A section\n")
    page = tmp_path / "page.md"
    markdown = ("# Page\n## Here: `x`\n"
                "[fine](other.md#a-section) [fine too](#here-x) [web](https://example.com/none#x)\n"
                "[no file](missing.md) [no heading](other.md#no-section) [not here](#nowhere)\n"
                "`[in code](missing-too.md)`\n```\n[in a block](missing-three.md)\n```\n")
    assert broken_links(page, markdown) == [
        "missing.md: no such file",
        "other.md#no-section: no heading with the anchor #no-section in other.md",
        "#nowhere: no heading with the anchor #nowhere in page.md",
    ]


def test_the_documents_are_found():
    names = {str(document.relative_to(ROOT)) for document in DOCUMENTS}
    assert {"README.md", "docs/design.md", "docs/running.md", "docs/running/local.md", "emulator/README.md",
            "emulator/docs/answers.md"} <= names


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda document: str(document.relative_to(ROOT)))
def test_every_relative_link_resolves(document):
    assert broken_links(document, document.read_text()) == []


LIB = ROOT / "lib" / "backlog_syphon"


def code_map() -> str:
    """The text of design.md's code map (its "Where the code is" section)."""
    text = (ROOT / "docs" / "design.md").read_text()
    start = text.index("## Where the code is")
    return text[start:text.index("\n## ", start + 1)]


def named_in(module: Path, text: str) -> bool:
    """Whether ``text`` names ``module`` (a path under the library): by its path, or by its file name beside
    each of its folders (``restore/`` ... ``amqp/`` ... ``values.py``)."""
    relative = module.relative_to(LIB)
    if f"`{relative.as_posix()}`" in text:
        return True
    return f"`{relative.name}`" in text and all(f"{folder}/" in text for folder in relative.parts[:-1])


def test_the_code_map_names_every_library_module():
    missing = [str(path.relative_to(LIB)) for path in sorted(LIB.rglob("*.py"))
               if path.name != "__init__.py" and not named_in(path, code_map())]
    assert not missing, f"docs/design.md's code map ('Where the code is') does not name: {missing}"
