"""The documentation's code blocks, as the tests that run them read them.

Every fenced block in README.md and docs/ is preceded by a marker line (a Markdown comment,
invisible on the site): ``<!-- tested: tests/FILE.py::TEST -->`` when that test runs the block
as written (with only names substituted: the test's own database, queue, user), or
``<!-- fragment -->`` when it is not a program on its own (output, a shape of a command, a
piece of a larger program). tests/test_docs_blocks.py holds every block to that rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONNECT = ('peewee.MySQLDatabase("outbox_lite", host="127.0.0.1", user="root",'
           ' charset="utf8mb4")')
_FENCE = re.compile(r"^(?P<indent>[ ]*)(?P<fence>```+)(?P<info>[^\n`]*)\n(?P<code>.*?)^(?P=indent)(?P=fence)[ ]*$",
                    re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Block:
    page: str       # the path from the repository's root, e.g. docs/getting-started.md
    line: int       # where the fence opens, 1-based
    lang: str
    code: str
    marker: str     # the marker line before it, "" when there is none


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(page: str | Path) -> list[Block]:
    path = ROOT / page if not Path(page).is_absolute() else Path(page)
    text = path.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        indent = match.group("indent")
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line
                         for line in match.group("code").split("\n"))
        found.append(Block(str(path.relative_to(ROOT)), text.count("\n", 0, match.start()) + 1,
                           match.group("info").strip().split(" ")[0], code,
                           before if before.startswith("<!--") else ""))
    return found


def block(page: str, *containing: str, lang: str | None = None) -> str:
    """The one block of ``page`` that holds every string in ``containing``."""
    matches = [b.code for b in blocks(page)
               if all(s in b.code for s in containing) and (lang is None or b.lang == lang)]
    assert len(matches) == 1, f"{page}: {len(matches)} blocks hold {containing!r}"
    return matches[0]


def connect(url) -> str:
    """The test database's connection, in place of the docs' ``CONNECT``."""
    return (f"peewee.MySQLDatabase({url.name!r}, host={url.host!r}, port={url.port},"
            f" user={url.user!r}, password={url.password!r}, charset=\"utf8mb4\")")
