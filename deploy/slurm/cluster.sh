#!/usr/bin/env bash
# A one-host Slurm cluster for the tests and for trying Hops over Slurm:
# munge, slurmctld, four slurmd (n1..n4, eight fake GPUs each) and slurmrestd
# with JWT on loopback, everything under one state directory.
#
#   deploy/slurm/cluster.sh start    # idempotent: a running cluster is left as it is
#   deploy/slurm/cluster.sh env      # the variables a client needs (eval them)
#   deploy/slurm/cluster.sh stop     # cancels its jobs, stops only what start started
#
# HOPS_SLURM_DIR (default /tmp/hops-slurm) and HOPS_SLURM_PORT (default 16817:
# slurmctld, then the four slurmd, then slurmrestd at +10) choose where.
# Needs root (slurmd, mknod) and Debian's slurm-wlm, slurmrestd and munge.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${HOPS_SLURM_DIR:-/tmp/hops-slurm}
PORT=${HOPS_SLURM_PORT:-16817}
REST_USER=${HOPS_SLURM_REST_USER:-hopsrest}
REST_PORT=$((PORT + 10))
KILL_WAIT=${HOPS_SLURM_KILL_WAIT:-5}
NODES=(n1 n2 n3 n4)
export SLURM_CONF=$DIR/etc/slurm.conf

say() { echo "cluster.sh: $*" >&2; }

# The pid in run/$1.pid when that process is alive and is still $2 (a pid
# file outlives its process, and the number may be reused).
live_pid() {
  local file=$DIR/run/$1.pid pid
  [[ -r $file ]] || return 1
  pid=$(<"$file")
  [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$2" || return 1
  echo "$pid"
}

all_running() {
  live_pid munged munged >/dev/null && live_pid slurmctld slurmctld >/dev/null \
    && live_pid slurmrestd slurmrestd >/dev/null || return 1
  local n
  for n in "${NODES[@]}"; do live_pid "slurmd-$n" slurmd >/dev/null || return 1; done
  scontrol ping >/dev/null 2>&1
}

render() {
  sed -e "s|@DIR@|$DIR|g" -e "s|@HOST@|$(hostname -s)|g" -e "s|@CTLD_PORT@|$PORT|g" \
      -e "s|@N1_PORT@|$((PORT + 1))|g" -e "s|@N2_PORT@|$((PORT + 2))|g" \
      -e "s|@N3_PORT@|$((PORT + 3))|g" -e "s|@N4_PORT@|$((PORT + 4))|g" \
      -e "s|@KILL_WAIT@|$KILL_WAIT|g" "$HERE/$1.in" >"$DIR/etc/$1"
}

prepare() {
  mkdir -p "$DIR"/{etc,munge,state,run,log,dev,work} "${NODES[@]/#/$DIR/spool/}"
  # slurmrestd reads slurm.conf as its own user, and jobs run as theirs.
  chmod 755 "$DIR" "$DIR/etc"
  chmod 1777 "$DIR/work"
  # 0711: users reach the socket by its path (a non-root client, such as the
  # bridge in deploy/compose.slurm.yaml), never list the folder or read the key
  chmod 711 "$DIR/munge"
  [[ -s $DIR/munge/munge.key ]] || { head -c 1024 /dev/urandom >"$DIR/munge/munge.key"; }
  [[ -s $DIR/etc/jwt.key ]] || { head -c 32 /dev/urandom >"$DIR/etc/jwt.key"; }
  chmod 400 "$DIR/munge/munge.key"
  chmod 600 "$DIR/etc/jwt.key"
  render slurm.conf
  render gres.conf
  local i
  for i in 0 1 2 3 4 5 6 7; do
    [[ -c $DIR/dev/nvidia$i ]] || mknod "$DIR/dev/nvidia$i" c 195 "$i"
  done
  # (A concurrent start may have made the user first: then it exists.)
  id -u "$REST_USER" >/dev/null 2>&1 \
    || useradd --system --no-create-home --shell /usr/sbin/nologin "$REST_USER" \
    || id -u "$REST_USER" >/dev/null
}

wait_for() {  # seconds, what, command...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { say "$what did not come up; logs in $DIR/log"; return 1; }
    sleep 0.2
  done
}

nodes_idle() { [[ $(sinfo -h -p hops -t idle -o %D) == 4 ]]; }
rest_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$REST_PORT") 2>/dev/null; }

start() {
  all_running && return 0
  stop
  # A start that fails half-way leaves nothing running (its logs stay).
  launch || { stop; return 1; }
}

# Each step returns on failure: under `launch || ...`, bash ignores set -e.
launch() {
  prepare || return 1
  munged --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" \
    --seed-file="$DIR/munge/munge.seed" --force || return 1
  slurmctld || return 1
  local n
  for n in "${NODES[@]}"; do slurmd -N "$n" || return 1; done
  wait_for 30 "the four idle nodes" nodes_idle || return 1
  # slurmrestd refuses to run as root: it runs as the user Hops acts as.
  setsid setpriv --reuid="$REST_USER" --regid="$REST_USER" --init-groups \
    env SLURM_JWT=daemon SLURM_CONF="$SLURM_CONF" \
    slurmrestd -a rest_auth/jwt -s openapi/v0.0.38 "127.0.0.1:$REST_PORT" \
    </dev/null >>"$DIR/log/slurmrestd.log" 2>&1 &
  echo $! >"$DIR/run/slurmrestd.pid"
  wait_for 15 "slurmrestd" rest_answers
}

# Ends the processes named by run/*.pid that are still what start started.
stop() {
  if live_pid slurmctld slurmctld >/dev/null; then
    scancel --partition=hops >/dev/null 2>&1 || true
    wait_for $((KILL_WAIT + 10)) "the cancel of the cluster's jobs" \
      test -z "$(squeue -h -p hops -o %i 2>/dev/null)" || true
  fi
  local name pids=() pid
  for name in slurmrestd "${NODES[@]/#/slurmd-}" slurmctld munged; do
    if pid=$(live_pid "$name" "${name%%-*}"); then kill "$pid" && pids+=("$pid"); fi
  done
  local deadline=$((SECONDS + 10))
  for pid in "${pids[@]}"; do
    while [[ -e /proc/$pid ]] && ((SECONDS < deadline)); do sleep 0.1; done
    [[ -e /proc/$pid ]] && kill -9 "$pid" 2>/dev/null || true
  done
  rm -f "$DIR"/run/*.pid
}

env_lines() {
  echo "SLURM_CONF=$SLURM_CONF"
  echo "HOPS_SLURM_DIR=$DIR"
  echo "HOPS_SLURM_REST_URL=http://127.0.0.1:$REST_PORT"
  echo "HOPS_SLURM_REST_USER=$REST_USER"
  echo "HOPS_SLURM_PARTITION=hops"
  echo "HOPS_SLURM_WORKDIR=$DIR/work"
}

case ${1:-} in
  start) start ;;
  stop) stop ;;
  env) env_lines ;;
  status) all_running ;;
  *) echo "usage: $0 start|stop|env|status" >&2; exit 2 ;;
esac
