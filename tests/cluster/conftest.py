"""The cluster suite's fixtures: a real MariaDB Galera cluster of 3 nodes (the PostgreSQL
failover test starts its own pair, scripts/postgres-standby.sh).

``OUTBOX_GALERA_URLS`` (the nodes' URLs, separated by spaces) names a running cluster; else
scripts/galera.sh starts one (on free ports, its state under /var/tmp/outbox-lite-galera) and
stops it, by its pids, after the session, unless it was already running before."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Iterator

import pytest

CHECKOUT = Path(__file__).resolve().parents[2]
GALERA = CHECKOUT / "scripts" / "galera.sh"


def _synced_nodes() -> int:
    done = subprocess.run([str(GALERA), "status"], capture_output=True, text=True)
    return sum(" Synced " in line for line in done.stdout.splitlines())


@pytest.fixture(scope="session")
def galera_urls() -> Iterator[list[str]]:
    given = os.environ.get("OUTBOX_GALERA_URLS")
    if given:
        yield given.split()
        return
    was_running = _synced_nodes() == 3
    started = subprocess.run([str(GALERA), "start", "3"], capture_output=True, text=True)
    if started.returncode != 0:
        pytest.exit(f"scripts/galera.sh start failed:\n{started.stderr}", returncode=3)
    try:
        yield started.stdout.split()
    finally:
        if not was_running:
            subprocess.run([str(GALERA), "stop"], check=False)


@pytest.fixture(scope="session")
def harness() -> ModuleType:
    """scripts/galera_relays.py, imported: its cases run from the tests as from the shell."""
    spec = importlib.util.spec_from_file_location(
        "galera_relays", CHECKOUT / "scripts" / "galera_relays.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["galera_relays"] = module
    spec.loader.exec_module(module)
    return module


GROUP_REPLICATION = CHECKOUT / "scripts" / "group-replication.sh"


def _online_members() -> int:
    done = subprocess.run([str(GROUP_REPLICATION), "status"], capture_output=True, text=True)
    return sum("\tONLINE\t" in line for line in done.stdout.splitlines())


@pytest.fixture(scope="session")
def group_replication_urls() -> Iterator[list[str]]:
    """A real MySQL 9.7 Group Replication group of 3 members (scripts/group-replication.sh,
    multi-primary at the start; each test sets the mode it needs with ``mode``).
    ``OUTBOX_GR_URLS`` names a running group instead; else one is started and stopped, by its
    pids, after the session unless it was running before."""
    given = os.environ.get("OUTBOX_GR_URLS")
    if given:
        yield given.split()
        return
    was_running = _online_members() == 3
    started = subprocess.run([str(GROUP_REPLICATION), "start", "3", "multi"],
                             capture_output=True, text=True)
    if started.returncode != 0:
        pytest.exit(f"scripts/group-replication.sh start failed:\n{started.stderr}", returncode=3)
    try:
        yield started.stdout.split()
    finally:
        if not was_running:
            subprocess.run([str(GROUP_REPLICATION), "stop"], check=False)

