#!/usr/bin/env bash
# The cluster suite (tests/cluster): the outbox on a real 3-node MariaDB Galera cluster (issue
# 36's case, a node SIGKILLed mid-drain) and on a PostgreSQL primary with a streaming standby
# (scripts/postgres-standby.sh: the primary killed, the standby promoted; asynchronous and
# synchronous). Not part of the default `pytest` run (setup.cfg's norecursedirs) nor of .ci/run:
# the Galera cluster takes about 15 s to start, the suite about three minutes on a 2-core
# machine. The figures (kill -> first publish, what an asynchronous standby lost) are printed
# with -s; docs/servers/clusters.md keeps them.
#
#   scripts/cluster-suite.sh [PYTEST ARGS...]
#
# With OUTBOX_GALERA_URLS (the nodes' URLs, separated by spaces) it runs against that cluster;
# else the suite starts one with scripts/galera.sh and stops it after (a cluster that was
# already running is left running). It uses the checkout's .venv when there is one (else
# python3; either with pip install -e '.[test]'), and Redis at 127.0.0.1:6379, where the
# relays' publisher (scripts/galera_publisher.py) counts every publish.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] && [ -z "${VIRTUAL_ENV:-}" ] && PYTHON=.venv/bin/python
exec "$PYTHON" -m pytest -c tests/cluster/pytest.ini --rootdir tests/cluster tests/cluster "$@"
