"""MkDocs hook: the command-line reference, generated from ``outbox_lite.cli``'s own parsers.

A page holding the line ``<!-- cli-reference -->`` gets, in its place, one section per
command and subcommand: its usage line, its description and a table of its arguments, all
read from the argparse parsers that ``outbox-lite`` itself builds. Nothing is copied by hand,
so a flag added, renamed or re-explained in the code shows here at the next build.
"""

from __future__ import annotations

import argparse
import html
import re
from typing import Any, Iterator

MARKER = "<!-- cli-reference -->"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name) or "", sub


def _cell(text: str) -> str:
    """One table cell of argparse's text: HTML and Markdown's own characters taken literally."""
    text = html.escape(" ".join(text.split()), quote=False)
    return re.sub(r"([\\`*_\[\]|])", r"\\\1", text)


def _flags(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        metavar = action.metavar or action.dest.upper()
        if isinstance(metavar, tuple):
            metavar = " ".join(metavar)
        metavar = " " + metavar
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _section(path: list[str], summary: str, parser: argparse.ArgumentParser) -> list[str]:
    formatter = parser._get_formatter()
    depth = min(len(path) + 1, 4)
    lines = [f"{'#' * depth} `{' '.join(path)}`", ""]
    if summary:
        lines += [f"*{_cell(summary)}*", ""]
    if parser.description:
        lines += [_cell(parser.description), ""]
    lines += ["```text", parser.format_usage().strip(), "```", ""]
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        text = formatter._expand_help(action) if action.help else ""
        if action.required and action.option_strings:
            text += " (required)"
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            text += " One of: " + ", ".join(f"`{c}`" for c in action.choices) + "."
        rows.append(f"| {_flags(action)} | {_cell(text)} |")
    if rows:
        lines += ["| argument | meaning |", "|---|---|", *rows, ""]
    for name, sub_summary, sub in _subcommands(parser):
        lines += _section([*path, name], sub_summary, sub)
    return lines


def reference() -> str:
    """The whole reference as Markdown."""
    from outbox_lite.cli import build_parser

    parser = build_parser()
    return "\n".join(_section(["outbox-lite"], "", parser))


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, reference())

