#!/usr/bin/env bash
# The cluster suite (tests/cluster): the outbox on a real 3-node MariaDB Galera cluster (issue
# 36's case, a node SIGKILLed mid-drain, ordered claims on every node, the write-set limit,
# wsrep_sync_wait), on a real 3-member MySQL 9.7 Group Replication group
# (scripts/group-replication.sh: multi-primary relays and writers on every member; the
# single-primary primary SIGKILLed mid-drain; the write-set limit) and on a PostgreSQL primary
# with a streaming standby (scripts/postgres-standby.sh: the primary killed, the standby
# promoted; asynchronous and synchronous). Not part of the default `pytest` run (setup.cfg's
# norecursedirs) nor of .ci/run: the clusters take about 15 s (Galera) and 21 s (Group
# Replication, from nothing) to start, the suite about four minutes on a 2-core machine. The
# figures (kill -> first publish, what an asynchronous standby lost) are printed with -s;
# docs/servers/clusters.md keeps them.
#
#   scripts/cluster-suite.sh [PYTEST ARGS...]
#
# With OUTBOX_GALERA_URLS / OUTBOX_GR_URLS (the nodes' URLs, separated by spaces) it runs
# against those clusters; else the suite starts them with scripts/galera.sh and
# scripts/group-replication.sh and stops them after (a cluster that was already running is left
# running; OUTBOX_MYSQL_ROOT picks the MySQL chroot). It uses the checkout's .venv when there is
# one (else python3; either with pip install -e '.[test]'), and Redis at 127.0.0.1:6379, where
# the relays' publisher (scripts/galera_publisher.py) counts every publish.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${VIRTUAL_ENV:-}" ] && PYTHON=.venv/bin/python
exec "$PYTHON" -m pytest -c tests/cluster/pytest.ini --rootdir tests/cluster tests/cluster "$@"
