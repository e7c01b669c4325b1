"""Every code block in README.md and docs/ is run by a test as written or marked a fragment
(tests/_docs.py says how), and a block that names its test names one that exists and reads
that block's page. Mermaid diagrams are exempt: scripts/check_site.py renders them."""

from __future__ import annotations

import re

from _docs import ROOT, TAB, TABS, block, blocks, pages

_TESTED = re.compile(r"<!-- tested: (tests/[\w/]+\.py)::(test_\w+) -->")


def test_every_block_is_tested_or_a_fragment():
    unmarked, wrong = [], []
    for page in pages():
        for b in blocks(page):
            if b.lang == "python" and b.marker == "<!-- fragment -->":
                # a piece of a program runs too, given the names it uses (issue 37)
                unmarked.append(f"{b.page}:{b.line} (python, marked a fragment)")
                continue
            if b.lang == "mermaid" or b.marker == "<!-- fragment -->":
                continue
            match = _TESTED.fullmatch(b.marker)
            if not match:
                unmarked.append(f"{b.page}:{b.line} ({b.lang or 'no language'})")
                continue
            path, name = match.groups()
            source = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).exists() else ""
            if f"def {name}(" not in source:
                wrong.append(f"{b.page}:{b.line} names {path}::{name}, which does not exist")
            elif b.page not in source and b.page.rsplit("/", 1)[-1] not in source:
                wrong.append(f"{b.page}:{b.line}: {path} never reads {b.page}")
    assert not unmarked, "blocks neither tested nor marked <!-- fragment -->:\n" + "\n".join(unmarked)
    assert not wrong, "\n".join(wrong)


def test_every_family_tab_has_its_sibling():
    """A block that speaks one family's SQL or URL sits in that family's tab, and the next
    block of the page is the other family's, run by the same test (the runner picks the one of
    the server under test); no other tab title is used."""
    tabbed = 0
    for page in pages():
        found = blocks(page)
        for b in found:
            assert b.tab in (None, *TABS.values()), f"{b.page}:{b.line}: tab {b.tab!r}"
        for first, second in zip(found, found[1:]):
            if first.tab == TABS["mysql"]:
                tabbed += 1
                assert (second.tab, second.marker, second.lang) == (
                    TABS["postgresql"], first.marker, first.lang), f"{first.page}:{first.line}"
            if second.tab == TABS["postgresql"]:
                assert first.tab == TABS["mysql"], f"{second.page}:{second.line}"
    assert tabbed >= 11  # the README's example, getting started's three, seven guides' one each


def test_the_runner_takes_the_tab_of_the_server_under_test():
    """The README's example: MySQL's in its <details>, PostgreSQL's in its own."""
    [mysql, postgresql] = [b for b in blocks("README.md") if b.tab]
    assert (mysql.tab, postgresql.tab) == (TABS["mysql"], TABS["postgresql"])
    assert "peewee.MySQLDatabase(" in mysql.code and "AUTO_INCREMENT" in mysql.code
    assert "peewee.PostgresqlDatabase(" in postgresql.code and "RETURNING id" in postgresql.code
    picked = block("README.md", "Relay(outbox, publisher)", lang="python")
    assert picked == {TABS["mysql"]: mysql, TABS["postgresql"]: postgresql}[TAB].code


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 150
