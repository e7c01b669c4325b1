#!/usr/bin/env bash
# A real MariaDB Galera cluster for the cluster tests: the machine's mariadbd (10.11) with
# Debian's galera-4 provider, every node on 127.0.0.1, state transfers by rsync.
#
#   scripts/galera.sh start [N]     start N nodes (default 3, or as many as the existing data
#                                   has): node 1 bootstraps the cluster (--wsrep-new-cluster),
#                                   the others join it; waits until every node is wsrep_ready,
#                                   Synced and counts N nodes, then prints one URL per node.
#                                   Nodes already running are left alone.
#   scripts/galera.sh stop          stop every node, by its pid (node 1 last, so that it is the
#                                   one safe to bootstrap from next time)
#   scripts/galera.sh kill I        SIGKILL node I (as a crash would)
#   scripts/galera.sh restart I     start node I again: it rejoins the running nodes (IST, or
#                                   an rsync SST) and is waited for until Synced
#   scripts/galera.sh status        each node: pid, port, wsrep state, cluster size
#   scripts/galera.sh urls          one mysql://root@127.0.0.1:PORT/DB URL per node (DB: the
#                                   second argument, default outbox_galera)
#   scripts/galera.sh url [DB]      one URL listing every node (host1:port1,host2:port2,...)
#   scripts/galera.sh forget        remove the stopped cluster's data directories
#
# Ports: node I listens for clients on BASE+10*(I-1), Galera's group communication on +1, IST
# on +2, rsync SST on +3. BASE is $OUTBOX_GALERA_BASE_PORT, else a free range picked at the
# first start and kept in $ROOT/base-port. OUTBOX_GALERA_ROOT (default
# /var/tmp/outbox-lite-galera) holds a folder per node: datadir, my.cnf, socket, pid file,
# error log. OUTBOX_GALERA_OPTIONS adds mariadbd options to every node's start.
#
# root@127.0.0.1 and root@localhost have no password (TCP logins). The nodes run as the user
# mysql: rsync SST's daemon on a joiner drops to nobody and cannot enter a root-owned datadir.
# Conflicts go to each node's error.log: wsrep_log_conflicts=ON logs the aborts by a replicated
# transaction ("cluster conflict due to high priority abort"); the provider's
# cert.log_conflicts=YES the COMMITs refused by certification ("trx conflict for key").
# Needs root (apt-get for galera-4 and rsync when missing, and to start mariadbd as mysql).
set -euo pipefail

ROOT="${OUTBOX_GALERA_ROOT:-/var/tmp/outbox-lite-galera}"
MARIADBD=/usr/sbin/mariadbd
PROVIDER=/usr/lib/galera/libgalera_smm.so
CLUSTER=outbox_lite_galera
WAIT=180   # seconds a node may take to be Synced (an SST of a large datadir takes longer)

say() { echo "galera: $*" >&2; }
fail() { say "$*"; exit 1; }

# galera-4, rsync, and the server itself (for its SST scripts and mariadb-install-db).
setup() {
    [ "$(id -u)" = 0 ] || fail "needs root (apt-get, and mariadbd started as the user mysql)"
    local missing=()
    [ -x "$MARIADBD" ] || missing+=(mariadb-server)
    command -v mariadb >/dev/null || missing+=(mariadb-client)
    [ -f "$PROVIDER" ] || missing+=(galera-4)
    command -v rsync >/dev/null || missing+=(rsync)
    command -v lsof >/dev/null || missing+=(lsof)   # wsrep_sst_rsync looks for its daemon
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null \
            || { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
                 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null; } \
            || fail "apt-get install ${missing[*]} failed"
        # The mariadb-server package starts the machine's own server if it had none: this
        # script leaves that one alone.
    fi
    id mysql >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin mysql \
        || fail "useradd mysql failed"
    mkdir -p "$ROOT"
    chmod 755 "$ROOT"
}

free_port() {   # is each of the ports given free on 127.0.0.1?
    python3 - "$@" <<'EOF'
import socket, sys
for port in sys.argv[1:]:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", int(port)))
        except OSError:
            sys.exit(1)
EOF
}

# The base port: the environment's, the one kept from a previous start, or a free range.
base_port() {
    if [ -n "${OUTBOX_GALERA_BASE_PORT:-}" ]; then
        [[ "$OUTBOX_GALERA_BASE_PORT" =~ ^[0-9]+$ ]] && [ "$OUTBOX_GALERA_BASE_PORT" -ge 1024 ] \
            && [ "$OUTBOX_GALERA_BASE_PORT" -le 65000 ] \
            || fail "bad OUTBOX_GALERA_BASE_PORT: $OUTBOX_GALERA_BASE_PORT"
        # kept, so that the commands after it (stop, urls, ...) find the same ports
        [ "$(cat "$ROOT/base-port" 2>/dev/null)" = "$OUTBOX_GALERA_BASE_PORT" ] \
            || echo "$OUTBOX_GALERA_BASE_PORT" >"$ROOT/base-port"
        echo "$OUTBOX_GALERA_BASE_PORT"
        return
    fi
    if [ -f "$ROOT/base-port" ]; then
        cat "$ROOT/base-port"
        return
    fi
    local base ports i
    for _ in $(seq 1 50); do
        # below 32768, where Linux's ephemeral ports begin (ip_local_port_range): a client's
        # own end of a connection never takes a node's port between two starts
        base=$(( 20000 + RANDOM % 120 * 100 ))
        ports=()
        for i in $(seq 0 $(( 10 * 9 + 3 ))); do ports+=($(( base + i ))); done
        if free_port "${ports[@]}"; then
            echo "$base" >"$ROOT/base-port"
            echo "$base"
            return
        fi
    done
    fail "found no free port range"
}

nodes() { cat "$ROOT/nodes" 2>/dev/null || echo 0; }
node_dir() { echo "$ROOT/node$1"; }
client_port() { echo $(( $(base_port) + 10 * ($1 - 1) )); }
gcomm_port() { echo $(( $(client_port "$1") + 1 )); }
pidfile() { echo "$(node_dir "$1")/node.pid"; }
socket() { echo "$(node_dir "$1")/mariadbd.sock"; }

node_of() {
    local i="${1:-}" n
    n="$(nodes)"
    [[ "$i" =~ ^[0-9]+$ ]] && [ "$i" -ge 1 ] && [ "$i" -le "$n" ] \
        || fail "no node ${i:-(none given)}: the cluster has $n (1..$n)"
    echo "$i"
}

running() {
    local pid
    pid="$(cat "$(pidfile "$1")" 2>/dev/null)" || return 1
    kill -0 "$pid" 2>/dev/null && [ "$(readlink "/proc/$pid/exe")" = "$MARIADBD" ]
}

# Each node's my.cnf: the settings Galera requires, distinct ports, defaults otherwise.
write_config() {
    local i=$1 n=$2 dir port gport address="" j
    dir="$(node_dir "$i")"
    port="$(client_port "$i")"
    gport="$(gcomm_port "$i")"
    for j in $(seq 1 "$n"); do address+="${address:+,}127.0.0.1:$(gcomm_port "$j")"; done
    cat >"$dir/my.cnf" <<EOF
# written by scripts/galera.sh: node $i of $n
[mariadbd]
user=mysql
datadir=$dir/data
port=$port
bind-address=127.0.0.1
socket=$(socket "$i")
pid-file=$dir/mariadbd.pid
log-error=$dir/error.log
skip-name-resolve=ON
binlog_format=ROW
default_storage_engine=InnoDB
innodb_autoinc_lock_mode=2
innodb_buffer_pool_size=128M
wsrep_on=ON
wsrep_provider=$PROVIDER
wsrep_cluster_name=$CLUSTER
wsrep_cluster_address=gcomm://$address
wsrep_node_name=node$i
wsrep_node_address=127.0.0.1:$gport
wsrep_node_incoming_address=127.0.0.1:$port
wsrep_provider_options="base_host=127.0.0.1;base_port=$gport;gmcast.listen_addr=tcp://127.0.0.1:$gport;ist.recv_addr=127.0.0.1:$(( port + 2 ));gcache.size=64M;cert.log_conflicts=YES"
wsrep_sst_method=rsync
wsrep_sst_receive_address=127.0.0.1:$(( port + 3 ))
wsrep_log_conflicts=ON

[client]
socket=$(socket "$i")
EOF
}

ask() {   # ask node I a query over its socket (as the OS user root), tab-separated rows
    mariadb --no-defaults --socket="$(socket "$1")" -uroot --connect-timeout=2 -N -B \
        -e "$2" 2>/dev/null
}

# "ready state size" of node I, e.g. "ON Synced 3" (nothing if it does not answer).
wsrep_state() {
    ask "$1" "SELECT
        (SELECT variable_value FROM information_schema.global_status WHERE variable_name='WSREP_READY'),
        (SELECT variable_value FROM information_schema.global_status WHERE variable_name='WSREP_LOCAL_STATE_COMMENT'),
        (SELECT variable_value FROM information_schema.global_status WHERE variable_name='WSREP_CLUSTER_SIZE')" \
        | tr '\t' ' '
}

# Wait until node I is ready, Synced and (given N) in a cluster of N.
wait_synced() {
    local i=$1 want=${2:-} pid state=""
    pid="$(cat "$(pidfile "$i")")"
    for _ in $(seq 1 $(( WAIT * 4 ))); do
        state="$(wsrep_state "$i" || true)"
        if [[ "$state" == "ON Synced "* ]] && { [ -z "$want" ] || [ "${state##* }" = "$want" ]; }; then
            return
        fi
        kill -0 "$pid" 2>/dev/null || { tail -20 "$(node_dir "$i")/error.log" >&2 || true
                                       fail "node $i (pid $pid) exited"; }
        sleep 0.25
    done
    tail -20 "$(node_dir "$i")/error.log" >&2 || true
    fail "node $i is not Synced after $WAIT s (last: ${state:-no answer})"
}

# A datadir for node 1 (the others get theirs from it by SST): mariadb-install-db.
initialise() {
    local i=$1 dir
    dir="$(node_dir "$i")"
    mkdir -p "$dir/data"
    chown mysql: "$dir" "$dir/data"
    chmod 750 "$dir"
    if [ "$i" = 1 ] && [ ! -d "$dir/data/mysql" ]; then
        say "initialising node 1's datadir"
        mariadb-install-db --no-defaults --user=mysql --datadir="$dir/data" \
            --auth-root-authentication-method=socket --skip-test-db >"$dir/install.log" 2>&1 \
            || { tail -5 "$dir/install.log" >&2; fail "mariadb-install-db failed"; }
    fi
}

# Start node I's mariadbd (as the user mysql) in the background and remember its pid.
launch() {
    local i=$1 dir pid
    dir="$(node_dir "$i")"
    shift
    # shellcheck disable=SC2086
    setsid "$MARIADBD" --defaults-file="$dir/my.cnf" "$@" ${OUTBOX_GALERA_OPTIONS:-} \
        >>"$dir/stdout.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$(pidfile "$i")"
}

# After a clean stop the last node down says safe_to_bootstrap: 1: bootstrap from it. Else
# (nodes killed, or stopped while a killed one was still counted) from the node whose
# grastate.dat has the highest seqno, node 1 when none has one (every node crashed: -1).
bootstrap_node() {
    local n=$1 i seqno best=1 best_seqno=-1 state
    for i in $(seq 1 "$n"); do
        state="$(node_dir "$i")/data/grastate.dat"
        grep -qs '^safe_to_bootstrap: 1' "$state" && { echo "$i"; return; }
        seqno="$(sed -n 's/^seqno: *//p' "$state" 2>/dev/null)"
        if [[ "$seqno" =~ ^[0-9]+$ ]] && [ "$seqno" -gt "$best_seqno" ]; then
            best=$i
            best_seqno=$seqno
        fi
    done
    echo "$best"
}

urls() {
    local db="${1:-outbox_galera}" i
    for i in $(seq 1 "$(nodes)"); do echo "mysql://root@127.0.0.1:$(client_port "$i")/$db"; done
}

url() {
    local db="${1:-outbox_galera}" i hosts=""
    for i in $(seq 1 "$(nodes)"); do hosts+="${hosts:+,}127.0.0.1:$(client_port "$i")"; done
    echo "mysql://root@$hosts/$db"
}

start() {
    local n="${1:-}" up=() i first t0 fresh=0
    setup
    [ -n "$n" ] || { n="$(nodes)"; [ "$n" -gt 0 ] || n=3; }
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 9 ] || fail "bad node count: $n"
    if [ "$(nodes)" -gt 0 ] && [ "$(nodes)" != "$n" ]; then
        fail "the data in $ROOT is of $(nodes) nodes, not $n (forget it first)"
    fi
    for i in $(seq 1 "$n"); do running "$i" && up+=("$i"); done
    if [ ${#up[@]} = "$n" ]; then
        say "running: $n nodes"
        urls
        return
    fi
    t0=$(date +%s.%N)
    if [ ${#up[@]} = 0 ] && [ -z "${OUTBOX_GALERA_BASE_PORT:-}" ] && [ -f "$ROOT/base-port" ]; then
        local kept ports=()
        kept="$(cat "$ROOT/base-port")"
        for i in $(seq 0 $(( 10 * 9 + 3 ))); do ports+=($(( kept + i ))); done
        # no node runs: the kept ports must be free, else another range (each my.cnf is
        # written anew at every start)
        free_port "${ports[@]}" || { say "ports from $kept are taken: another range"; \
                                     rm -f "$ROOT/base-port"; }
    fi
    base_port >/dev/null
    echo "$n" >"$ROOT/nodes"
    [ -d "$(node_dir 1)/data/mysql" ] || fresh=1
    for i in $(seq 1 "$n"); do
        initialise "$i"
        write_config "$i" "$n"
    done
    if [ ${#up[@]} = 0 ]; then
        first="$(bootstrap_node "$n")"
        if [ -f "$(node_dir "$first")/data/grastate.dat" ]; then
            sed -i 's/^safe_to_bootstrap: 0/safe_to_bootstrap: 1/' "$(node_dir "$first")/data/grastate.dat"
        fi
        say "bootstrapping the cluster on node $first (127.0.0.1:$(client_port "$first"))"
        launch "$first" --wsrep-new-cluster
        wait_synced "$first"
        if [ "$fresh" = 1 ]; then   # TCP logins for root, no password; replicated to all
            ask "$first" "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
                GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
                ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING '';" \
                || fail "could not create root@127.0.0.1 on node $first"
        fi
        up+=("$first")
    fi
    for i in $(seq 1 "$n"); do
        [[ " ${up[*]} " == *" $i "* ]] && continue
        say "starting node $i (127.0.0.1:$(client_port "$i"))"
        launch "$i"
    done
    for i in $(seq 1 "$n"); do wait_synced "$i" "$n"; done
    for i in $(seq 1 "$n"); do
        mariadb --no-defaults --protocol=TCP -h127.0.0.1 -P"$(client_port "$i")" -uroot \
            --connect-timeout=2 -e 'SELECT 1' >/dev/null 2>&1 \
            || fail "node $i answers on its socket but root@127.0.0.1 cannot log in over TCP"
    done
    say "$n nodes Synced in $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s"
    urls
}

stop_node() {
    local i=$1 pid
    running "$i" || return 0
    pid="$(cat "$(pidfile "$i")")"
    kill -TERM "$pid"
    for _ in $(seq 1 240); do
        kill -0 "$pid" 2>/dev/null || { rm -f "$(pidfile "$i")"; say "node $i stopped (pid $pid)"; return; }
        sleep 0.25
    done
    fail "node $i (pid $pid) did not stop within 60 s"
}

stop() {
    local n i
    n="$(nodes)"
    for i in $(seq "$n" -1 1); do stop_node "$i"; done
}

kill_node() {
    local i pid
    i="$(node_of "${1:-}")"
    running "$i" || fail "node $i is not running"
    pid="$(cat "$(pidfile "$i")")"
    kill -KILL "$pid"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    rm -f "$(pidfile "$i")"
    say "node $i killed (pid $pid)"
}

restart() {
    local i t0 others=0 j
    i="$(node_of "${1:-}")"
    setup
    running "$i" && { say "node $i is running"; return; }
    for j in $(seq 1 "$(nodes)"); do running "$j" && others=$(( others + 1 )); done
    [ "$others" -gt 0 ] || fail "no node is running: start the cluster with '$0 start'"
    t0=$(date +%s.%N)
    launch "$i"
    wait_synced "$i"
    say "node $i Synced again in $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')") s"
}

status() {
    local n i state
    n="$(nodes)"
    [ "$n" -gt 0 ] || { say "no cluster in $ROOT"; return 1; }
    for i in $(seq 1 "$n"); do
        if running "$i"; then
            state="$(wsrep_state "$i" || true)"
            echo "node $i: pid $(cat "$(pidfile "$i")"), 127.0.0.1:$(client_port "$i"), ${state:-not answering}"
        else
            echo "node $i: stopped, 127.0.0.1:$(client_port "$i")"
        fi
    done
}

forget() {
    local i
    for i in $(seq 1 "$(nodes)"); do running "$i" && fail "node $i is still running (stop first)"; done
    rm -rf "${ROOT:?}"/node* "$ROOT/nodes" "$ROOT/base-port"
    say "forgot $ROOT"
}

case "${1:-}" in
    start) start "${2:-}" ;;
    stop) stop ;;
    kill) kill_node "${2:-}" ;;
    restart) restart "${2:-}" ;;
    status) status ;;
    urls) urls "${2:-}" ;;
    url) url "${2:-}" ;;
    forget) forget ;;
    *) echo "usage: $0 start [N] | stop | kill I | restart I | status | urls [DB] | url [DB] | forget" >&2
       exit 2 ;;
esac
