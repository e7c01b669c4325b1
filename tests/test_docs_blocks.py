"""Every code block in README.md and docs/ is run by a test as written or marked a fragment
(tests/_docs.py says how), and a block that names its test names one that exists and reads
that block's page. Mermaid diagrams are exempt: tests/test_docs_browser.py renders them."""

from __future__ import annotations

import re

from _docs import ROOT, blocks, pages

_TESTED = re.compile(r"<!-- tested: (tests/[\w/]+\.py)::(test_\w+) -->")


def test_every_block_is_tested_or_a_fragment():
    unmarked, wrong = [], []
    for page in pages():
        for b in blocks(page):
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


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) < 150
