"""The documentation's code blocks, as the tests that run them read them.

Every fenced block in README.md and docs/ is preceded by a marker line (a Markdown comment,
invisible on the site): ``<!-- tested: tests/FILE.py::TEST -->`` when that test runs the block
as written (with only names substituted: the test's own database, queue, user; a piece of a
larger program is run with the names it uses given), or ``<!-- fragment -->`` when it is not
run (output, a shape of a command; never Python). tests/test_docs_blocks.py holds every block
to that rule.

Where servers differ, a page gives each family's block side by side: in the docs as MkDocs
Material content tabs (``=== "MySQL / MariaDB"``, ``=== "PostgreSQL"``, the block indented
under its tab), in README.md (which GitHub shows, without tabs) inside
``<details><summary>MySQL / MariaDB</summary>`` … ``</details>``. :func:`block` picks the one
of the test server's family (``_helpers.FAMILY``), :data:`CONNECT` and :func:`connect` are
that family's connection line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from _helpers import FAMILY

ROOT = Path(__file__).resolve().parent.parent
#: The title of each family's tab, as the pages write it.
TABS = {"mysql": "MySQL / MariaDB", "postgresql": "PostgreSQL"}
#: The tab of the test server's family.
TAB = TABS[FAMILY.name]
#: Each family's connection line in the docs' programs (the database the setup made).
CONNECTS = {
    "mysql": ('peewee.MySQLDatabase("outbox_lite", host="127.0.0.1", user="root",'
              ' charset="utf8mb4")'),
    "postgresql": 'peewee.PostgresqlDatabase("outbox_lite", host="127.0.0.1", user="postgres")',
}
CONNECT = CONNECTS[FAMILY.name]
#: Each family's URL of that database, as the pages give it to the commands.
URLS = {"mysql": "mysql://root@127.0.0.1:3306/outbox_lite",
        "postgresql": "postgresql://postgres@127.0.0.1:5432/outbox_lite"}
_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)(?P=fence)[ ]*$",
                    re.DOTALL | re.MULTILINE)
_TAB = re.compile(r'^(?P<indent>[ ]*)=== "(?P<title>[^"]+)"[ ]*$')
_SUMMARY = re.compile(r"^<details(?: open)?><summary>(?P<title>[^<]+)</summary>$")


@dataclass(frozen=True)
class Block:
    page: str       # the path from the repository's root, e.g. docs/getting-started.md
    line: int       # where the fence opens, 1-based
    lang: str
    code: str
    marker: str     # the marker line before it, "" when there is none
    tab: str | None = None  # the family tab (or README <details>) it is in, None outside one


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _tab_of(lines: list[str], index: int, indent: str) -> str | None:
    """The title of the content tab (``=== "…"`` less indented than the block) or of the
    ``<details><summary>…</summary>`` that holds the line ``index``, None when none does."""
    for line in reversed(lines[:index]):
        if indent:
            tab = _TAB.match(line)
            if tab and len(tab["indent"]) < len(indent):
                return tab["title"]
            if line.strip() and len(line) - len(line.lstrip(" ")) < len(indent):
                return None  # left the block's container: not a tab
        else:
            if line.strip() == "</details>":
                return None
            summary = _SUMMARY.match(line.strip())
            if summary:
                return summary["title"]
    return None


def blocks(page: str | Path) -> list[Block]:
    path = ROOT / page if not Path(page).is_absolute() else Path(page)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    found = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        indent = match.group("indent")
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line
                         for line in match.group("code").split("\n"))
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(str(path.relative_to(ROOT)), line,
                           match.group("info").strip().split(" ")[0], code,
                           before if before.startswith("<!--") else "",
                           _tab_of(lines, line - 1, indent)))
    return found


def family_blocks(page: str | Path) -> list[Block]:
    """``page``'s blocks outside any tab and those in the test server's family's tab."""
    return [b for b in blocks(page) if b.tab in (None, TAB)]


def block(page: str, *containing: str, lang: str | None = None) -> str:
    """The one block of ``page`` (outside tabs or in the test server's tab) that holds every
    string in ``containing``."""
    matches = [b.code for b in family_blocks(page)
               if all(s in b.code for s in containing) and (lang is None or b.lang == lang)]
    assert len(matches) == 1, f"{page} ({TAB}): {len(matches)} blocks hold {containing!r}"
    return matches[0]


def connect(url) -> str:
    """The test database's connection, in place of the docs' ``CONNECT``."""
    if FAMILY.name == "postgresql":
        password = f", password={url.password!r}" if url.password else ""
        return (f"peewee.PostgresqlDatabase({url.name!r}, host={url.host!r}, port={url.port},"
                f" user={url.user!r}{password})")
    return (f"peewee.MySQLDatabase({url.name!r}, host={url.host!r}, port={url.port},"
            f" user={url.user!r}, password={url.password!r}, charset=\"utf8mb4\")")
