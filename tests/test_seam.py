"""The database seam (STYLE.md, "one database seam"): outside the family modules
(``outbox_lite/_families/``) the library names no server's error numbers or SQLSTATEs, writes
no MySQL- or PostgreSQL-only SQL (``FORCE INDEX``, backticks, ``ON CONFLICT``,
``LAST_INSERT_ID``) and imports no driver. Read from the source (its syntax tree: docstrings
and comments may say what they like), so a new module that breaks the rule fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import outbox_lite

PACKAGE = Path(outbox_lite.__file__).resolve().parent
FAMILIES = PACKAGE / "_families"

#: Error numbers of MySQL and MariaDB (server and client) the library has ever tested.
MYSQL_ERRNOS = frozenset({
    1007, 1040, 1044, 1045, 1049, 1053, 1062, 1142, 1143, 1146, 1153, 1205, 1213, 1301, 1698,
    1927, 2002, 2003, 2005, 2006, 2013, 2026, 2055, 4031})
#: A SQLSTATE: two characters of class, three of subclass (23505, 40P01, 55P03, 3D000 …).
SQLSTATE = re.compile(r"[0-9][0-9A-Z][0-9A-Z]{3}")
#: The classes a database library would test: connection, constraint, transaction rollback,
#: syntax or access, resources, object state, operator intervention, catalog, authorization.
SQLSTATE_CLASSES = frozenset({"08", "23", "40", "42", "53", "55", "57", "3D", "28", "25"})
SQL_WORDS = ("FORCE INDEX", "ON CONFLICT", "LAST_INSERT_ID", "`")
DRIVERS = ("pymysql", "psycopg", "psycopg2", "MySQLdb", "mysql", "pg8000", "asyncpg")


def _outside_families() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py"))
            if FAMILIES not in path.parents]


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value,
                                                                      ast.Constant):
                found.add(id(body[0].value))
    return found


def breaches(source: str) -> list[str]:
    """What in ``source`` (a module's text) crosses the seam, one phrase each with its line."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            names = []
        for name in names:
            if name.split(".")[0] in DRIVERS:
                found.append((node.lineno, f"imports {name}"))
        if not isinstance(node, ast.Constant) or id(node) in docstrings:
            continue
        value = node.value
        if isinstance(value, int) and not isinstance(value, bool) and value in MYSQL_ERRNOS:
            found.append((node.lineno, f"MySQL error number {value}"))
        elif isinstance(value, str):
            if SQLSTATE.fullmatch(value) and value[:2] in SQLSTATE_CLASSES:
                found.append((node.lineno, f"SQLSTATE {value!r}"))
            found += [(node.lineno, f"{word!r} in {value[:60]!r}")
                      for word in SQL_WORDS if word in value]
    return [f"line {line}: {what}" for line, what in sorted(found)]


def test_the_checker_finds_what_crosses_the_seam():
    """Each kind of breach is found (and a docstring or comment is not one)."""
    source = '''"""Docstrings may name 1062, FORCE INDEX, `x` and 40P01."""
import pymysql
from psycopg import errors  # a comment may say ON CONFLICT
DUPLICATE = 1062
if code == "40P01" or code == "23505":
    pass
SQL = "SELECT id FROM outbox_event FORCE INDEX (PRIMARY) WHERE `id` = %s"
UPSERT = "INSERT … ON CONFLICT DO NOTHING"
ID = "SELECT LAST_INSERT_ID()"
BATCH = 1000
'''
    found = breaches(source)
    assert [phrase.split(":", 1)[0] for phrase in found] == [
        "line 2", "line 3", "line 4", "line 5", "line 5", "line 7", "line 7", "line 8",
        "line 9"], found


def test_nothing_outside_the_families_crosses_the_seam():
    found = {str(path.relative_to(PACKAGE)): breaches(path.read_text())
             for path in _outside_families()}
    assert {path: phrases for path, phrases in found.items() if phrases} == {}
