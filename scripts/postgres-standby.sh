#!/usr/bin/env bash
# A PostgreSQL 15 primary with a streaming standby, for the cluster suite's failover test: the
# machine's own binaries (/usr/lib/postgresql/15/bin), run as the OS user postgres, both on
# 127.0.0.1 on free ports, trust authentication (replication too) on 127.0.0.1 only.
#
#   scripts/postgres-standby.sh start        initdb the primary (when missing), start it, take
#                                            the standby by pg_basebackup -R (when missing),
#                                            start it; waits until the standby streams; prints
#                                            the URL listing both hosts (primary first)
#   scripts/postgres-standby.sh stop         stop both (fast shutdown), each by its pid
#   scripts/postgres-standby.sh kill-primary SIGKILL the primary's postmaster and every child
#                                            of it (as a crash would), by their pids
#   scripts/postgres-standby.sh promote      promote the standby (pg_ctl promote -w)
#   scripts/postgres-standby.sh status       each server: port, pid, in recovery or not
#   scripts/postgres-standby.sh url [DB]     the URL listing both hosts (DB default postgres)
#   scripts/postgres-standby.sh forget       remove both data directories (stopped first)
#
# OUTBOX_PG_STANDBY_ROOT (default /var/tmp/outbox-lite-pg-standby) holds primary/, standby/
# (data directories, sockets, logs) and ports (the two ports, picked free at the first start).
# OUTBOX_PG_STANDBY_SYNC=1 at the first start makes the standby synchronous
# (synchronous_standby_names='*' on the primary; '' on the standby, so that once promoted it
# does not wait for a standby of its own). Needs root (to run the servers as postgres).
set -euo pipefail

ROOT="${OUTBOX_PG_STANDBY_ROOT:-/var/tmp/outbox-lite-pg-standby}"
BIN=/usr/lib/postgresql/15/bin

say() { echo "postgres-standby: $*" >&2; }
fail() { say "$*"; exit 1; }
as_pg() { runuser -u postgres -- "$@"; }

[ "$(id -u)" = 0 ] || fail "needs root (the servers run as the user postgres)"
[ -x "$BIN/postgres" ] || fail "no PostgreSQL 15 binaries in $BIN"

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

ports() {
    if [ ! -f "$ROOT/ports" ]; then
        mkdir -p "$ROOT"
        echo "$(free_port) $(free_port)" >"$ROOT/ports"
    fi
    read -r PRIMARY_PORT STANDBY_PORT <"$ROOT/ports"
}

pid_of() {  # the postmaster's pid of data directory $1, when it runs
    local pidfile="$ROOT/$1/data/postmaster.pid" pid
    [ -f "$pidfile" ] || return 1
    pid="$(head -1 "$pidfile")"
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

psql_at() {  # psql_at PORT SQL
    "$BIN/psql" -h 127.0.0.1 -p "$1" -U postgres -d postgres -XAtqc "$2"
}

configure() {  # configure NAME PORT
    local dir="$ROOT/$1"
    cat >>"$dir/data/postgresql.auto.conf" <<EOF
port = $2
listen_addresses = '127.0.0.1'
unix_socket_directories = '$dir'
wal_level = replica
max_wal_senders = 5
hot_standby = on
wal_keep_size = '64MB'
fsync = on
EOF
}

start_server() {  # start_server NAME
    local dir="$ROOT/$1"
    pid_of "$1" >/dev/null && return 0
    as_pg "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null \
        || { tail -20 "$dir/server.log" >&2; fail "$1 did not start"; }
}

url() {
    ports
    echo "postgresql://postgres@127.0.0.1:$PRIMARY_PORT,127.0.0.1:$STANDBY_PORT/${1:-postgres}"
}

start() {
    ports
    local began=$SECONDS
    if [ ! -f "$ROOT/primary/data/PG_VERSION" ]; then
        mkdir -p "$ROOT/primary/data"
        chown -R postgres "$ROOT"
        as_pg "$BIN/initdb" -D "$ROOT/primary/data" -U postgres -A trust -E UTF8 \
            --locale=C.UTF-8 >/dev/null
        echo "host replication all 127.0.0.1/32 trust" >>"$ROOT/primary/data/pg_hba.conf"
        configure primary "$PRIMARY_PORT"
        if [ "${OUTBOX_PG_STANDBY_SYNC:-0}" = 1 ]; then
            echo "synchronous_standby_names = '*'" >>"$ROOT/primary/data/postgresql.auto.conf"
        fi
    fi
    start_server primary
    if [ ! -f "$ROOT/standby/data/PG_VERSION" ]; then
        mkdir -p "$ROOT/standby"
        chown postgres "$ROOT/standby"
        as_pg "$BIN/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres \
            -D "$ROOT/standby/data" -R -X stream -c fast
        configure standby "$STANDBY_PORT"
        echo "synchronous_standby_names = ''" >>"$ROOT/standby/data/postgresql.auto.conf"
    fi
    start_server standby
    local deadline=$((SECONDS + 60))
    until [ "$(psql_at "$PRIMARY_PORT" "SELECT count(*) FROM pg_stat_replication
                                        WHERE state = 'streaming'" 2>/dev/null)" = 1 ]; do
        [ $SECONDS -lt $deadline ] || fail "the standby does not stream"
        sleep 0.1
    done
    say "primary on $PRIMARY_PORT, standby on $STANDBY_PORT, streaming after $((SECONDS - began)) s"
    url
}

stop() {
    ports
    local name pid
    for name in standby primary; do
        if pid="$(pid_of "$name")"; then
            kill -TERM "$pid"   # fast shutdown
            while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
        fi
    done
}

kill_primary() {
    local pid child
    pid="$(pid_of primary)" || fail "the primary is not running"
    kill -KILL "$pid"
    for child in $(ps -o pid= --ppid "$pid"); do
        kill -KILL "$child" 2>/dev/null || true
    done
}

promote() {
    pid_of standby >/dev/null || fail "the standby is not running"
    as_pg "$BIN/pg_ctl" -D "$ROOT/standby/data" -w -t 60 promote >/dev/null
}

status() {
    ports
    local name port pid
    for name in primary standby; do
        port=$PRIMARY_PORT; [ "$name" = standby ] && port=$STANDBY_PORT
        if pid="$(pid_of "$name")"; then
            echo "$name port=$port pid=$pid in_recovery=$(psql_at "$port" \
                "SELECT pg_is_in_recovery()" 2>/dev/null || echo '?')"
        else
            echo "$name port=$port stopped"
        fi
    done
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    kill-primary) kill_primary ;;
    promote) promote ;;
    status) status ;;
    url) url "${2:-}" ;;
    forget) stop; rm -rf "$ROOT" ;;
    *) fail "usage: $0 start|stop|kill-primary|promote|status|url [DB]|forget" ;;
esac
