#!/usr/bin/env bash
# A real MySQL server for the tests, beside the machine's MariaDB.
#
# Debian 12 ships no MySQL, and Debian sid's mysql-server-core (9.7) needs a newer glibc than
# the host's, so it runs inside a Debian sid chroot. A chroot shares the host's network: the
# server inside listens on 127.0.0.1:PORT of the host. Authentication stays MySQL's default,
# caching_sha2_password, as real MySQL 8.4/9.x users have it.
#
#   scripts/mysql-server.sh setup          build the chroot and initialise the data directory
#                                          (idempotent: what exists is kept)
#   scripts/mysql-server.sh start [PORT]   setup, then start mysqld on PORT (default 3308) and
#                                          wait until it answers; a running one is left alone
#   scripts/mysql-server.sh stop [PORT]    stop the one started on PORT, by its pid
#   scripts/mysql-server.sh url [PORT]     print the test URL for it
#   scripts/mysql-server.sh forget PORT    remove a stopped server's data directory (private
#                                          servers of the tests, started on a free port)
#
# OUTBOX_MYSQL_ROOT (default /var/tmp/outbox-lite-mysql) holds the chroot, about 0.6 GB.
# OUTBOX_MYSQL_OPTIONS adds mysqld options to a start (e.g. --skip-log-bin to compare).
# Needs root (debootstrap, chroot) and Debian's package mirror.
set -euo pipefail

ROOT="${OUTBOX_MYSQL_ROOT:-/var/tmp/outbox-lite-mysql}"
MIRROR="${OUTBOX_MYSQL_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=(mysql-server-core mysql-client-core)
APT=(apt-get -o Acquire::Check-Valid-Until=false -o Dpkg::Use-Pty=0 -y -q)

say() { echo "mysql-server: $*" >&2; }
fail() { say "$*"; exit 1; }

port_of() {
    local port="${1:-3308}"
    [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1 ] && [ "$port" -le 65535 ] \
        || fail "bad port: $port"
    echo "$port"
}

# The chroot, then the server packages in it; each step is skipped once done.
setup() {
    [ "$(id -u)" = 0 ] || fail "needs root (debootstrap and chroot)"
    if [ ! -x "$ROOT/bin/bash" ]; then
        if ! command -v debootstrap >/dev/null; then
            say "installing debootstrap"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
        fi
        say "debootstrap sid into $ROOT (about 30 s)"
        rm -rf "$ROOT.partial"
        debootstrap --variant=minbase sid "$ROOT.partial" "$MIRROR" >"$ROOT.log" 2>&1 \
            || { tail -5 "$ROOT.log" >&2; fail "debootstrap failed (log: $ROOT.log)"; }
        mv "$ROOT.partial" "$ROOT"
    fi
    if [ ! -x "$ROOT/usr/sbin/mysqld" ]; then
        say "installing ${PACKAGES[*]} in the chroot"
        # The mirror's sid Release file may be past its Valid-Until date.
        chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive "${APT[@]}" update >>"$ROOT.log" 2>&1 \
            && chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive \
                "${APT[@]}" install --no-install-recommends "${PACKAGES[@]}" >>"$ROOT.log" 2>&1 \
            || { tail -5 "$ROOT.log" >&2; fail "apt-get in the chroot failed (log: $ROOT.log)"; }
        chroot "$ROOT" apt-get clean
    fi
}

datadir() { echo "/var/lib/outbox-mysql-$1"; }   # inside the chroot, one per port

# A data directory per port, initialised with a root account that has no password (the
# tests make password accounts of their own).
initialise() {
    local port=$1 dir
    dir="$(datadir "$port")"
    mkdir -p "$ROOT/var/lib/mysql-files" "$ROOT/run/mysqld"   # mysqld refuses to start without it
    if [ ! -d "$ROOT$dir/mysql" ]; then
        rm -rf "${ROOT:?}$dir"
        say "initialising $dir"
        chroot "$ROOT" /usr/sbin/mysqld --no-defaults --initialize-insecure --user=root \
            --datadir="$dir" >>"$ROOT.log" 2>&1 \
            || { tail -5 "$ROOT.log" >&2; fail "mysqld --initialize-insecure failed"; }
    fi
}

pidfile() { echo "$ROOT/run/mysqld/outbox-$1.pid"; }

running() {
    local pid
    pid="$(cat "$(pidfile "$1")" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null && [ "$(readlink "/proc/$pid/root")" = "$ROOT" ]
}

ping() {
    chroot "$ROOT" mysqladmin --no-defaults --protocol=TCP -h127.0.0.1 -P"$1" -uroot \
        --connect-timeout=2 ping >/dev/null 2>&1
}

start() {
    local port dir log pid
    port="$(port_of "${1:-}")"
    setup
    initialise "$port"
    if running "$port"; then
        ping "$port" && { say "running on 127.0.0.1:$port"; return; }
    fi
    dir="$(datadir "$port")"
    log="$ROOT/var/log/outbox-mysql-$port.log"
    # Settings as shipped by MySQL, but for the ones that keep it on the test port and out of
    # the host's way. Binary logging is left on (MySQL's default, as in production).
    setsid chroot "$ROOT" /usr/sbin/mysqld --no-defaults --user=root --datadir="$dir" \
        --port="$port" --bind-address=127.0.0.1 --mysqlx=OFF \
        --socket="/run/mysqld/outbox-$port.sock" --pid-file="/run/mysqld/outbox-$port.pid.mysqld" \
        --log-error="/var/log/outbox-mysql-$port.log" ${OUTBOX_MYSQL_OPTIONS:-} \
        >/dev/null 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$(pidfile "$port")"
    for _ in $(seq 1 120); do
        ping "$port" && { say "started on 127.0.0.1:$port (pid $pid)"; return; }
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.5
    done
    tail -20 "$log" >&2 || true
    fail "mysqld did not answer on 127.0.0.1:$port"
}

stop() {
    local port pid
    port="$(port_of "${1:-}")"
    running "$port" || { say "not running on $port"; return; }
    pid="$(cat "$(pidfile "$port")")"
    kill -TERM "$pid"
    for _ in $(seq 1 120); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$(pidfile "$port")"; say "stopped (pid $pid)"; return; }
        sleep 0.5
    done
    fail "mysqld (pid $pid) did not stop within 60 s"
}

forget() {
    local port
    port="$(port_of "${1:-}")"
    running "$port" && fail "still running on $port (stop it first)"
    rm -rf "${ROOT:?}$(datadir "$port")" "$ROOT/var/log/outbox-mysql-$port.log"
}

case "${1:-}" in
    setup) setup ;;
    start) start "${2:-}" ;;
    stop) stop "${2:-}" ;;
    forget) forget "${2:-}" ;;
    url) echo "mysql://root@127.0.0.1:$(port_of "${2:-}")/outbox_lite_test" ;;
    *) echo "usage: $0 setup | start [PORT] | stop [PORT] | forget PORT | url [PORT]" >&2; exit 2 ;;
esac
