"""The command-line reference page is generated from outbox-lite's own parsers
(docs/_hooks/cli_reference.py): every command, subcommand and flag is in it, with its help."""

from __future__ import annotations

import argparse
import importlib.util

from outbox_lite.cli import build_parser

from _docs import ROOT


def _hook():
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "docs" / "_hooks" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _parsers(parser, path):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, [*path, name])


def test_every_command_and_flag_is_in_the_generated_reference():
    hook = _hook()
    text = hook.reference()
    page = (ROOT / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert hook.MARKER in page  # the page is generated, not written
    assert hook.on_page_markdown(page, None).count(hook.MARKER) == 0
    commands = 0
    for path, parser in _parsers(build_parser(), ["outbox-lite"]):
        commands += 1
        assert f"`{' '.join(path)}`" in text, path
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in text, (path, flag)
    assert commands >= 9  # outbox-lite, migrate, contention, stats, ..., inbox purge
