#!/usr/bin/env bash
# A single-node SLURM cluster on this machine, with accounting, for CI and for trying
# `hydra/launcher=slurm` before a real cluster. Debian/Ubuntu packages (SLURM 22.05 on Debian 12),
# run as root, no systemd needed:
#
#   bash .ci/slurm_cluster.sh start          # install what is missing, start, wait for an idle node
#   eval "$(bash .ci/slurm_cluster.sh env)"  # SLURM_CONF for sinfo, sbatch, sacct, prunelab
#   bash .ci/slurm_cluster.sh status
#   bash .ci/slurm_cluster.sh stop           # cancel its jobs, stop the daemons it started
#   bash .ci/slurm_cluster.sh fail-node      # the node dies: slurmd and its jobs' processes SIGKILLed
#   bash .ci/slurm_cluster.sh restore-node   # slurmd started again; waits for an idle node
#
# Daemons: munged (as user munge, its own socket), MariaDB (127.0.0.1 only, its own port and data
# folder) for slurmdbd, slurmdbd, slurmctld, slurmd; SLURM's ports bind to 127.0.0.1
# (CommunicationParameters=NoInAddrAny). Every file lives under $PRUNELAB_SLURM_DIR
# (/var/lib/prunelab-slurm); `start` wipes it (stopping a previous start's daemons first), so it
# works any number of times in a row. `stop` stops only the PIDs `start` wrote to $STATE/pids, each
# checked against its recorded start time, so a recycled PID is never signalled.
set -euo pipefail

STATE=${PRUNELAB_SLURM_DIR:-/var/lib/prunelab-slurm}
CLUSTER=prunelab
PARTITION=${PRUNELAB_SLURM_PARTITION:-cpu}
DB_PORT=${PRUNELAB_SLURM_DB_PORT:-3307}
CTLD_PORT=${PRUNELAB_SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${PRUNELAB_SLURM_SLURMD_PORT:-6818}
DBD_PORT=${PRUNELAB_SLURM_DBD_PORT:-6819}
PACKAGES=(munge slurmctld slurmd slurm-client slurmdbd mariadb-server)
PIDS=$STATE/pids
CONF=$STATE/etc/slurm.conf
MUNGE_SOCKET=$STATE/munge/munge.socket
DB_SOCKET=$STATE/mysql/mysqld.sock
export SLURM_CONF=$CONF

say() { echo "slurm_cluster: $*" >&2; }
die() { say "error: $*"; exit 1; }

wait_for() {  # wait_for SECONDS WHAT COMMAND...: retry COMMAND every 0.5 s
    local limit=$1 what=$2 start=$SECONDS
    shift 2
    until "$@" >/dev/null 2>&1; do
        ((SECONDS - start < limit)) || die "$what not ready after ${limit} s (logs: $STATE/log/)"
        sleep 0.5
    done
}

start_time() { awk '{print $22}' "/proc/$1/stat" 2>/dev/null; }

launch() {  # launch NAME COMMAND...: start a foreground daemon in its own session, record its PID
    local name=$1
    shift
    setsid "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null &
    local pid=$!
    sleep 0.2
    kill -0 "$pid" 2>/dev/null || die "$name exited at once (log: $STATE/log/$name.out)"
    echo "$name $pid $(start_time "$pid")" >>"$PIDS"
}

ours() {  # ours PID STARTTIME: the PID is still the process we started
    [[ -e /proc/$1 && "$(start_time "$1")" == "$2" ]]
}

install_packages() {
    local missing=()
    for cmd in munged slurmctld slurmd sinfo sacct slurmdbd mariadbd; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    ((${#missing[@]})) || return 0
    say "installing ${PACKAGES[*]} (missing: ${missing[*]})"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
}

write_slurm_conf() {
    local node topology
    node=$(hostname -s)
    # "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
    topology=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')
    cat >"$CONF" <<EOF
# Written by .ci/slurm_cluster.sh: one node, 127.0.0.1 only, accounting through slurmdbd.
ClusterName=$CLUSTER
SlurmctldHost=localhost
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
SchedulerType=sched/backfill
ReturnToService=2
MailProg=/bin/true
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCKET
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
KillWait=30
InactiveLimit=0
SlurmctldTimeout=30
# A silent node is DOWN (its jobs NODE_FAIL) after this long: short, so fail-node takes seconds
SlurmdTimeout=20
NodeName=$node NodeAddr=127.0.0.1 $topology State=UNKNOWN
PartitionName=$PARTITION Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
}

write_slurmdbd_conf() {  # $1: the database password
    (umask 077; cat >"$STATE/etc/slurmdbd.conf" <<EOF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
CommunicationParameters=NoInAddrAny
SlurmUser=root
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$1
StorageLoc=slurm_acct_db
EOF
    )
}

start_munge() {
    install -d -o munge -g munge -m 755 "$STATE/munge"
    (umask 077; head -c 1024 /dev/urandom >"$STATE/munge/munge.key")
    chown munge:munge "$STATE/munge/munge.key"
    launch munged setpriv --reuid=munge --regid=munge --init-groups \
        munged --foreground --socket="$MUNGE_SOCKET" --key-file="$STATE/munge/munge.key" \
        --log-file="$STATE/munge/munged.log" --pid-file="$STATE/munge/munged.pid" \
        --seed-file="$STATE/munge/munged.seed"
    wait_for 20 munged bash -c "munge -n -S '$MUNGE_SOCKET' | unmunge -S '$MUNGE_SOCKET'"
}

start_mariadb() {  # $1: the password slurmdbd will use
    install -d -o mysql -g mysql -m 750 "$STATE/mysql" "$STATE/mysql/data"
    mariadb-install-db --no-defaults --user=mysql --datadir="$STATE/mysql/data" \
        --auth-root-authentication-method=socket --skip-test-db >>"$STATE/log/mariadb-install.out" 2>&1
    launch mariadbd mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql/data" \
        --socket="$DB_SOCKET" --pid-file="$STATE/mysql/mariadbd.pid" --bind-address=127.0.0.1 \
        --port="$DB_PORT" --skip-name-resolve --innodb-buffer-pool-size=64M --innodb-lock-wait-timeout=900 \
        --log-error="$STATE/log/mariadbd.log"
    wait_for 60 mariadbd mariadb-admin --no-defaults --socket="$DB_SOCKET" ping
    mariadb --no-defaults --socket="$DB_SOCKET" -u root <<EOF
CREATE DATABASE slurm_acct_db;
CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$1';
CREATE USER 'slurm'@'localhost' IDENTIFIED BY '$1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
EOF
}

check_loopback() {  # NoInAddrAny binds what the host name resolves to: it must be loopback
    local address
    address=$(getent ahostsv4 "$(hostname)" | awk 'NR == 1 {print $1}')
    [[ $address == 127.* ]] || die "$(hostname) resolves to ${address:-nothing}, not a loopback address:" \
        "the daemons would listen there; add '127.0.1.1 $(hostname)' to /etc/hosts"
}

node_idle() { [[ "$(sinfo -h -N -o %T 2>/dev/null)" == idle ]]; }

start() {
    [[ $EUID -eq 0 ]] || die "run as root (it starts system daemons and may apt-get install)"
    local began=$SECONDS password
    [[ -s $PIDS ]] && { say "stopping the daemons of a previous start"; stop; }
    install_packages
    check_loopback
    rm -rf "$STATE"
    mkdir -p "$STATE"/{etc,log,run,spool/ctld,spool/d}
    : >"$PIDS"
    password=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
    write_slurm_conf
    write_slurmdbd_conf "$password"
    start_munge
    start_mariadb "$password"
    launch slurmdbd slurmdbd -D
    wait_for 60 slurmdbd sacctmgr -n list cluster
    sacctmgr -i add cluster "$CLUSTER" >/dev/null
    launch slurmctld slurmctld -D -f "$CONF"
    wait_for 60 slurmctld scontrol ping
    launch slurmd slurmd -D -f "$CONF"
    wait_for 60 "an idle node" node_idle
    wait_for 60 "accounting (sacct)" sacct -n -X
    say "cluster $CLUSTER up in $((SECONDS - began)) s: partition $PARTITION, node $(hostname -s)" \
        "($(sinfo -h -o '%c CPUs, %m MB')); SLURM_CONF=$CONF"
}

cancel_jobs() {  # the cluster's own jobs (their processes are slurmd's): cancel, wait until gone
    scontrol ping >/dev/null 2>&1 || return 0
    local jobs
    jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ')
    [[ -n ${jobs// } ]] || return 0
    say "cancelling jobs $jobs"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    local start=$SECONDS
    while [[ -n "$(squeue -h -o %i 2>/dev/null)" ]] && ((SECONDS - start < 60)); do sleep 1; done
}

stop() {
    [[ -s $PIDS ]] || { say "nothing to stop (no $PIDS)"; return 0; }
    cancel_jobs
    local name pid began
    # last started, first stopped: slurmd, slurmctld, slurmdbd, mariadbd, munged
    tac "$PIDS" | while read -r name pid began; do
        if ! ours "$pid" "$began"; then
            say "$name ($pid) already gone"
            continue
        fi
        local since=$SECONDS
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 1 60); do ours "$pid" "$began" || break; sleep 0.5; done
        if ours "$pid" "$began"; then
            say "$name ($pid) ignored SIGTERM for 30 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        say "stopped $name ($pid) in $((SECONDS - since)) s"
    done
    rm -f "$PIDS"
}

daemon_pid() {  # daemon_pid NAME: the recorded PID of a daemon `start` launched, if still ours
    local name pid began
    while read -r name pid began; do
        [[ $name == "$1" ]] && ours "$pid" "$began" && { echo "$pid"; return 0; }
    done <"$PIDS"
    return 1
}

fail_node() {  # what a node lost with its power looks like to slurmctld: nothing answers any more
    [[ -s $PIDS ]] || die "not started (no $PIDS)"
    local slurmd job_pids steps=() pid parent
    slurmd=$(daemon_pid slurmd) || die "slurmd is not running"
    # every process of the node's jobs (scontrol asks each job's slurmstepd), and those slurmstepds
    job_pids=$(scontrol listpids 2>/dev/null | awk 'NR > 1 {print $1}')
    for pid in $job_pids; do
        parent=$pid
        while [[ -e /proc/$parent ]] && [[ $(awk '{print $4}' "/proc/$parent/stat") != 1 ]]; do
            parent=$(awk '{print $4}' "/proc/$parent/stat")
        done
        [[ -e /proc/$parent ]] && steps+=("$parent")
    done
    # shellcheck disable=SC2086
    kill -KILL "$slurmd" "${steps[@]}" $job_pids 2>/dev/null || true
    say "node failed: killed slurmd ($slurmd), slurmstepd (${steps[*]:-none}), job processes (${job_pids//$'\n'/ })"
}

restore_node() {  # slurmd again (ReturnToService=2 puts the node back in service when it registers)
    [[ -s $PIDS ]] || die "not started (no $PIDS)"
    daemon_pid slurmd >/dev/null && die "slurmd is running"
    sed -i '/^slurmd /d' "$PIDS"
    launch slurmd slurmd -D -f "$CONF"
    wait_for 60 "an idle node" node_idle
    say "node back: slurmd $(daemon_pid slurmd)"
}

status() {
    [[ -s $PIDS ]] || { say "not started (no $PIDS)"; return 1; }
    local name pid began down=0
    while read -r name pid began; do
        if ours "$pid" "$began"; then say "$name $pid running"; else say "$name $pid gone"; down=1; fi
    done <"$PIDS"
    sinfo 2>/dev/null || down=1
    return $down
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    fail-node) fail_node ;;
    restore-node) restore_node ;;
    env) echo "export SLURM_CONF=$CONF" ;;
    *) echo "usage: $0 start|stop|status|env|fail-node|restore-node" >&2; exit 2 ;;
esac
