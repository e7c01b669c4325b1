#!/usr/bin/env bash
# A real MySQL 9.7 Group Replication group for the cluster tests: the chroot of
# scripts/mysql-server.sh (its mysqld and group_replication.so), every member on 127.0.0.1.
#
#   scripts/group-replication.sh start [N] [multi]  start N members (default 3): member 1
#                                   bootstraps the group, the others join it one at a time;
#                                   waits until N members are ONLINE, then prints one URL per
#                                   member. "multi": multi-primary mode (writes on every
#                                   member); else single-primary (member 1 the primary).
#                                   Members already running are left alone.
#   scripts/group-replication.sh stop         stop every member, by its pid
#   scripts/group-replication.sh kill I       SIGKILL member I (as a crash would)
#   scripts/group-replication.sh restart I    start member I again and rejoin the group
#   scripts/group-replication.sh mode single|multi  switch the running group's mode online
#                                   (group_replication_switch_to_*_mode; single: member 1, or
#                                   the first running member, the primary) and keep it for
#                                   members started again
#   scripts/group-replication.sh status       the group's members, their state and role
#   scripts/group-replication.sh urls [DB]    one mysql://root@127.0.0.1:PORT/DB per member
#   scripts/group-replication.sh forget       remove the stopped group's data directories
#
# Ports: member I listens for clients on BASE+10*(I-1) and for the group on +1. BASE is
# $OUTBOX_GR_BASE_PORT, else a free range picked at the first start and kept in the state
# folder. The mode is kept there too. Facts of ../shared/CLUSTERS.md: members initialised
# without a binlog (no GTIDs of their own), the recovery user made by the init file,
# mysqlx off, report_host/report_port for recovery, recovery_get_public_key on, binlogs
# expiring after an hour. Needs root (the chroot).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="${OUTBOX_MYSQL_ROOT:-/var/tmp/outbox-lite-mysql}"
STATE="$ROOT/var/lib/outbox-gr"      # inside the chroot: /var/lib/outbox-gr
GROUP=aaaaaaaa-bbbb-4ccc-8ddd-0123456789ab
REPL_PASSWORD=outbox-gr-recovery     # the recovery account's, on 127.0.0.1 only
WAIT=120

say() { echo "group-replication: $*" >&2; }
fail() { say "$*"; exit 1; }

free_base() {
    python3 - <<'PY'
import socket
for base in range(22000, 32000, 100):  # below Linux's ephemeral ports (32768 on)
    ports = [base + 10 * i + j for i in range(5) for j in range(2)]
    try:
        socks = []
        for port in ports:
            s = socket.socket()
            s.bind(("127.0.0.1", port))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    break
PY
}

base() {
    if [ -n "${OUTBOX_GR_BASE_PORT:-}" ]; then echo "$OUTBOX_GR_BASE_PORT"; return; fi
    [ -f "$STATE/base-port" ] || { mkdir -p "$STATE"; free_base >"$STATE/base-port"; }
    cat "$STATE/base-port"
}
port() { echo $(( $(base) + 10 * ($1 - 1) )); }
gcs_port() { echo $(( $(port "$1") + 1 )); }
members() { local n; n="$(cat "$STATE/members" 2>/dev/null || echo 3)"; seq 1 "$n"; }
pidfile() { echo "$STATE/member-$1.pid"; }

running() {
    local pid
    pid="$(cat "$(pidfile "$1")" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null
}

sql() {  # sql I STATEMENT: run STATEMENT on member I, print the rows tab-separated
    chroot "$ROOT" mysql --no-defaults --protocol=TCP -h127.0.0.1 -P"$(port "$1")" -uroot \
        --connect-timeout=2 -N -B -e "$2"
}

initialise() {
    local i=$1 dir="/var/lib/outbox-gr/member-$i"
    [ -d "$ROOT$dir/mysql" ] && return
    rm -rf "${ROOT:?}$dir"
    mkdir -p "$ROOT/var/lib/outbox-gr" "$ROOT/var/lib/mysql-files" "$ROOT/run/mysqld"
    cat >"$ROOT/var/lib/outbox-gr/init.sql" <<SQL
CREATE USER 'repl'@'127.0.0.1' IDENTIFIED BY '$REPL_PASSWORD';
GRANT REPLICATION SLAVE, CONNECTION_ADMIN, BACKUP_ADMIN, GROUP_REPLICATION_STREAM ON *.* TO 'repl'@'127.0.0.1';
CREATE USER 'root'@'127.0.0.1';
GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
SQL
    chroot "$ROOT" /usr/sbin/mysqld --no-defaults --initialize-insecure --user=root \
        --disable-log-bin --init-file=/var/lib/outbox-gr/init.sql --datadir="$dir" \
        >>"$STATE/init.log" 2>&1 || { tail -5 "$STATE/init.log" >&2; fail "initialising member $i failed"; }
}

launch() {  # launch I: start member I's mysqld (not yet in the group)
    local i=$1 seeds="" j mode
    mode="$(cat "$STATE/mode")"
    for j in $(members); do seeds+="${seeds:+,}127.0.0.1:$(gcs_port "$j")"; done
    local options=(--no-defaults --user=root --datadir="/var/lib/outbox-gr/member-$i"
        --port="$(port "$i")" --bind-address=127.0.0.1 --mysqlx=OFF
        --socket="/run/mysqld/outbox-gr-$i.sock" --pid-file="/run/mysqld/outbox-gr-$i.pid.mysqld"
        --log-error="/var/lib/outbox-gr/member-$i.log" --server-id="$i"
        --gtid-mode=ON --enforce-gtid-consistency=ON --log-bin=binlog --log-replica-updates=ON
        --binlog-expire-logs-seconds=3600 --report-host=127.0.0.1 --report-port="$(port "$i")"
        --plugin-load-add=group_replication.so
        --loose-group-replication-group-name="$GROUP"
        --loose-group-replication-start-on-boot=OFF
        --loose-group-replication-local-address="127.0.0.1:$(gcs_port "$i")"
        --loose-group-replication-group-seeds="$seeds"
        --loose-group-replication-ip-allowlist=127.0.0.1/8
        --loose-group-replication-recovery-get-public-key=ON)
    if [ "$mode" = multi ]; then
        options+=(--loose-group-replication-single-primary-mode=OFF
                  --loose-group-replication-enforce-update-everywhere-checks=ON)
    fi
    setsid chroot "$ROOT" /usr/sbin/mysqld "${options[@]}" ${OUTBOX_GR_OPTIONS:-} \
        >/dev/null 2>&1 </dev/null &
    echo $! >"$(pidfile "$i")"
    for _ in $(seq 1 $((WAIT * 2))); do
        sql "$i" "SELECT 1" >/dev/null 2>&1 && return
        kill -0 "$(cat "$(pidfile "$i")")" 2>/dev/null || break
        sleep 0.5
    done
    tail -20 "$ROOT/var/lib/outbox-gr/member-$i.log" >&2 || true
    fail "member $i did not answer on 127.0.0.1:$(port "$i")"
}

online() {  # how many members member I sees ONLINE
    sql "$1" "SELECT COUNT(*) FROM performance_schema.replication_group_members
              WHERE MEMBER_STATE = 'ONLINE'" 2>/dev/null || echo 0
}

join() {  # join I [bootstrap]
    local i=$1
    local start="START GROUP_REPLICATION USER='repl', PASSWORD='$REPL_PASSWORD'"
    if [ "${2:-}" = bootstrap ]; then
        sql "$i" "SET GLOBAL group_replication_bootstrap_group = ON; $start;
                  SET GLOBAL group_replication_bootstrap_group = OFF"
    else
        sql "$i" "$start"
    fi
}

wait_online() {  # wait_online I N: until member I sees N members ONLINE
    for _ in $(seq 1 $((WAIT * 2))); do
        [ "$(online "$1")" -ge "$2" ] && return
        sleep 0.5
    done
    fail "member $1 sees $(online "$1") members ONLINE, not $2"
}

start() {
    local n=${1:-3} mode=${2:-single} i started=$SECONDS
    [ "$(id -u)" = 0 ] || fail "needs root (the chroot)"
    "$HERE/mysql-server.sh" setup
    mkdir -p "$STATE"
    if ! running 1; then
        echo "$n" >"$STATE/members"
        echo "$mode" >"$STATE/mode"
    fi
    n="$(cat "$STATE/members")"
    for i in $(members); do initialise "$i"; done
    local first=yes
    for i in $(members); do
        if running "$i"; then first=no; continue; fi
        launch "$i"
        if [ "$first" = yes ]; then
            join "$i" bootstrap
            first=no
            wait_online "$i" 1
        else
            join "$i"
            wait_online "$i" "$i"
        fi
    done
    wait_online 1 "$n"
    say "$n members ONLINE ($(cat "$STATE/mode")-primary) in $((SECONDS - started)) s"
    urls
}

stop() {
    local i pid
    for i in $(members | sort -r); do
        running "$i" || continue
        pid="$(cat "$(pidfile "$i")")"
        sql "$i" "STOP GROUP_REPLICATION" >/dev/null 2>&1 || true
        kill -TERM "$pid"
        for _ in $(seq 1 120); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
        kill -0 "$pid" 2>/dev/null && fail "member $i (pid $pid) did not stop"
        rm -f "$(pidfile "$i")"
        say "member $i stopped (pid $pid)"
    done
}

kill_member() {
    running "$1" || fail "member $1 is not running"
    kill -KILL "$(cat "$(pidfile "$1")")"
    rm -f "$(pidfile "$1")"
    say "member $1 killed"
}

restart() {
    local i=$1 started=$SECONDS other
    running "$i" && fail "member $i is running"
    launch "$i"
    join "$i"
    for other in $(members); do [ "$other" != "$i" ] && running "$other" && break; done
    wait_online "$i" "$(members | wc -l)"
    say "member $i ONLINE again in $((SECONDS - started)) s"
}

mode() {
    local want=$1 i
    case "$want" in single|multi) ;; *) fail "mode: single or multi, not $want" ;; esac
    for i in $(members); do running "$i" && break; done
    running "$i" || fail "no member is running"
    if [ "$want" = multi ]; then
        sql "$i" "SELECT group_replication_switch_to_multi_primary_mode()" >/dev/null
    elif [ "$(sql "$i" "SELECT @@group_replication_single_primary_mode")" = 1 ]; then
        sql "$i" "SELECT group_replication_set_as_primary(@@server_uuid)" >/dev/null
    else
        sql "$i" "SELECT group_replication_switch_to_single_primary_mode(@@server_uuid)" >/dev/null
    fi
    echo "$want" >"$STATE/mode"
    say "the group is $want-primary"
}

status() {
    local i
    for i in $(members); do
        if running "$i"; then
            echo "member $i: pid $(cat "$(pidfile "$i")"), port $(port "$i")"
        else
            echo "member $i: stopped"
        fi
    done
    for i in $(members); do
        running "$i" || continue
        sql "$i" "SELECT MEMBER_PORT, MEMBER_STATE, MEMBER_ROLE FROM
                  performance_schema.replication_group_members ORDER BY MEMBER_PORT"
        break
    done
}

urls() {
    local i
    for i in $(members); do echo "mysql://root@127.0.0.1:$(port "$i")/${1:-outbox_gr}"; done
}

forget() {
    local i
    for i in $(members); do running "$i" && fail "member $i is still running (stop first)"; done
    rm -rf "${STATE:?}"
}

case "${1:-}" in
    start) start "${2:-3}" "${3:-single}" ;;
    stop) stop ;;
    kill) kill_member "${2:?member number}" ;;
    restart) restart "${2:?member number}" ;;
    mode) mode "${2:?single or multi}" ;;
    status) status ;;
    urls) urls "${2:-}" ;;
    forget) forget ;;
    *) echo "usage: $0 start [N] [multi] | stop | mode single|multi | kill I | restart I | status | urls [DB] | forget" >&2
       exit 2 ;;
esac
