"""The layers of outbox_lite (docs/development.md, "The layers"): every module imports only
modules of its own layer or of the layers below, and no modules import each other in a circle.

Read from the source (its syntax tree), without importing the package: every import counts,
those inside functions and under ``if TYPE_CHECKING:`` too, so a new import that points up or
closes a circle fails here. The one exception is an import under ``if TYPE_CHECKING:`` named in
:data:`TYPE_ONLY` with the reason it must point back (it is never made at run time). The picture in docs/development.md is checked against the same
table: its layers, their modules and its arrows (one for each pair of layers an import joins).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "outbox_lite"
PICTURE = ROOT / "docs" / "development.md"

#: The layers, from the ground up; a name is a module's path in the package without ``.py``,
#: a folder with ``/`` stands for every module in it, ``__init__`` is the package's face.
LAYERS: dict[str, tuple[str, ...]] = {
    "ground": ("errors", "models", "backoff", "payload", "_credentials", "_signals",
               "_version"),
    "contract": ("_families/contract", "_families/url"),
    "families": ("_families/mysql", "_families/mysql_sql", "_families/mysql_server",
                 "_families/mysql_packet", "_families/postgresql",
                 "_families/postgresql_sql"),
    "table": ("_families/__init__",),
    "connection": ("_db", "_session", "_clock", "_schema", "_checks", "_named_lock"),
    "records": ("repository", "inbox", "migrate", "wake", "tracing", "publishers/"),
    "relay": ("relay/", "metrics", "contention/", "__init__"),
    "cli": ("cli/",),
}


#: Imports made only under ``if TYPE_CHECKING:`` (for annotations, never at run time) that
#: may point back within a layer, each with its reason. Any other such import counts.
TYPE_ONLY: dict[tuple[str, str], str] = {}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name (``outbox_lite._families.mysql``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _target(name: str, known: dict[str, Path]) -> str | None:
    """The module of ours that importing ``name`` loads (None for another package's)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _typing_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under an ``if TYPE_CHECKING:`` (or ``typing.TYPE_CHECKING``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING",
                                                                    "typing.TYPE_CHECKING"):
            found.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return found


def imports(package: Path = PACKAGE, *, typing_only: bool = False) -> dict[str, set[str]]:
    """For each module, the modules of ours it imports, anywhere in it; with ``typing_only``,
    those it imports only under ``if TYPE_CHECKING:``."""
    known = modules(package)
    found: dict[str, set[str]] = {name: set() for name in known}
    at_run_time: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        typing = _typing_only(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                wanted = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                # ``from . import x`` imports the module x when there is one, else a name of .
                wanted = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                          for alias in node.names]
            else:
                continue
            for target in filter(None, (_target(each, known) for each in wanted)):
                if target != name:
                    found[name].add(target)
                    if id(node) not in typing:
                        at_run_time[name].add(target)
    if typing_only:
        return {name: found[name] - at_run_time[name] for name in known}
    return found


def checked_imports(package: Path = PACKAGE) -> dict[str, set[str]]:
    """:func:`imports` less the type-only imports that :data:`TYPE_ONLY` documents."""
    typing = imports(package, typing_only=True)
    return {name: {target for target in targets
                   if not (target in typing[name] and (name, target) in TYPE_ONLY)}
            for name, targets in imports(package).items()}


def layer_of(name: str, layers: dict[str, tuple[str, ...]] = LAYERS) -> str | None:
    """The layer of a dotted module name, by the table (None when it names none)."""
    relative = name.split(".", 1)[1] if "." in name else "__init__"
    path = relative.replace(".", "/")
    for layer, members in layers.items():
        for member in members:
            if member.endswith("/") and (path + "/").startswith(member):
                return layer
            if member == path or member == f"{path}/__init__":
                return layer
    return None


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import from a module to one of a higher layer, as ``a (layer) -> b (layer)``."""
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    found = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            low, high = layer_of(name), layer_of(target)
            if low is not None and high is not None and rank[high] > rank[low]:
                found.append(f"{name} ({low}) -> {target} ({high})")
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph.get(name, ())):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            members = []
            while True:
                member = stack.pop()
                members.append(member)
                if member == name:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def picture() -> tuple[dict[str, tuple[str, ...]], set[tuple[str, str]]]:
    """The layers and arrows of the Mermaid picture in docs/development.md: each node is
    ``layer["layer<br/>module · module<br/>module"]``, each arrow ``upper --> lower``."""
    text = PICTURE.read_text()
    block = re.search(r"```mermaid\n(.*?)```", text.split("## The layers", 1)[1], re.S)
    assert block, "docs/development.md has no Mermaid picture under '## The layers'"
    layers: dict[str, tuple[str, ...]] = {}
    arrows = set()
    for line in block[1].splitlines():
        node = re.fullmatch(r'\s*(\w+)\["([^"]*)"\]\s*', line)
        arrow = re.fullmatch(r"\s*(\w+)\s*-->\s*(\w+)\s*", line)
        if node:
            title, *rows = node[2].split("<br/>")
            assert title == node[1], line
            layers[node[1]] = tuple(member.strip() for row in rows
                                    for member in row.split(" · "))
        elif arrow:
            arrows.add((arrow[1], arrow[2]))
    return layers, arrows


def layer_arrows(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(upper layer, lower layer) for each pair of layers that an import joins."""
    return {(layer_of(name), layer_of(target)) for name, targets in graph.items()
            for target in targets if layer_of(name) != layer_of(target)}


def test_every_module_has_a_layer():
    assert [name for name in modules() if layer_of(name) is None] == []


def test_every_name_in_the_table_is_a_module():
    names = modules()
    missing = [member for members in LAYERS.values() for member in members
               if not any(layer_of(name, {"x": (member,)}) for name in names)]
    assert missing == []


def test_no_import_points_up_a_layer():
    assert upward(checked_imports()) == []


def test_no_modules_import_each_other_in_a_circle():
    assert circles(checked_imports()) == []


def test_each_documented_type_only_import_is_one():
    """A TYPE_ONLY entry names an import the code makes only under TYPE_CHECKING."""
    typing = imports(typing_only=True)
    assert [pair for pair in TYPE_ONLY if pair[1] not in typing.get(pair[0], ())] == []


def test_the_picture_draws_the_table_and_the_imports():
    layers, arrows = picture()
    assert list(layers.items()) == list(LAYERS.items())[::-1]  # drawn from the top down
    assert arrows == layer_arrows(checked_imports())


@pytest.mark.parametrize("source, expected", [
    ("from ._families import family_of", {"outbox_lite._families"}),
    ("from ._families.mysql import OPTIONS", {"outbox_lite._families.mysql"}),
    ("def f():\n    from .relay import Relay", {"outbox_lite.relay"}),
    ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .cli import main",
     {"outbox_lite.cli"}),
    ("from . import _checks, __version__", {"outbox_lite._checks", "outbox_lite"}),
    ("import outbox_lite.relay\nimport peewee", {"outbox_lite.relay"}),
])
def test_the_reader_finds_every_kind_of_import(tmp_path, source, expected):
    """An import at the top, in a function, under TYPE_CHECKING, relative or absolute."""
    package = tmp_path / "outbox_lite"
    for name in ("__init__", "_checks", "relay", "_families/__init__", "_families/mysql",
                 "cli/__init__", "probe"):
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / f"{name}.py").write_text("")
    (package / "probe.py").write_text(source)
    assert imports(package)["outbox_lite.probe"] == expected
    typing = imports(package, typing_only=True)["outbox_lite.probe"]
    assert typing == ({"outbox_lite.cli"} if "TYPE_CHECKING" in source else set())


def test_the_checks_find_a_circle_and_an_import_up():
    graph = {"outbox_lite._db": {"outbox_lite._families"},
             "outbox_lite._families": {"outbox_lite._families.mysql"},
             "outbox_lite._families.mysql": {"outbox_lite._db"},
             "outbox_lite.models": {"outbox_lite.relay"}}
    assert circles(graph) == [["outbox_lite._db", "outbox_lite._families",
                               "outbox_lite._families.mysql"]]
    assert upward(graph) == [
        "outbox_lite._families.mysql (families) -> outbox_lite._db (connection)",
        "outbox_lite.models (ground) -> outbox_lite.relay (relay)"]
