#!/bin/bash
# Benchmark helper for a shared machine (not part of meshtax itself): run a measurement under
# the machine's measurement lock (/run/meshtax-measure.lock, the one BENCHMARKS.md's commands
# take) with every other process on the machine capped at QUIET_CAP percent of one CPU (default
# 25; a cgroup-v1 CPU quota), so that other people's builds and tests do not land in it.
# Processes started during the measurement outside it are capped too (swept every 3 s). The
# cap is lifted before the lock is released, on any exit. Root only; cgroup v1's cpu
# controller only (says so and exits 78 otherwise).
# Usage: sudo scripts/quiet-measure.sh CMD ARGS...
set -u
CAP=${QUIET_CAP:-25}
CG=/sys/fs/cgroup/cpu/mtx-bg
if [ $# -eq 0 ]; then echo "usage: $0 CMD ARGS..." >&2; exit 64; fi
if [ ! -d /sys/fs/cgroup/cpu ] || [ ! -w /sys/fs/cgroup/cpu ]; then
  echo "quiet-measure: needs root and cgroup v1's cpu controller at /sys/fs/cgroup/cpu" >&2; exit 78
fi
exec 9>/run/meshtax-measure.lock
flock -w 7200 9 || { echo "quiet-measure: lock not obtained" >&2; exit 75; }
# while this waited for the lock, the measurement holding it may have capped this script too
echo $$ > /sys/fs/cgroup/cpu/cgroup.procs
mkdir -p "$CG"
echo 100000 > "$CG/cpu.cfs_period_us"
me=$$
anc=" $me "; p=$me
while [ "$p" != 1 ] && [ -n "$p" ]; do p=$(awk '{print $4}' /proc/$p/stat 2>/dev/null); anc="$anc$p "; done
# a process is spared when it is an ancestor of this script or descends from it
ppid_of() {  # builtins only: the sweep runs every 3 s
  local line rest
  REPLY=0
  { read -r line < "/proc/$1/stat"; } 2>/dev/null || return
  rest=${line##*) }; set -- $rest; REPLY=${2:-0}
}
spared() {
  local q=$1
  case "$anc" in *" $q "*) return 0;; esac
  while [ -n "$q" ] && [ "$q" != 1 ] && [ "$q" != 0 ]; do
    [ "$q" = "$me" ] && return 0
    ppid_of "$q"; q=$REPLY
  done
  return 1
}
sweep() {
  local n=0 d pid
  local inside=" $(tr '\n' ' ' < "$CG/cgroup.procs") "
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    [ "$pid" = 1 ] && continue
    case "$inside" in *" $pid "*) continue;; esac
    readlink "$d/exe" >/dev/null 2>&1 || continue   # kernel threads have no exe
    spared "$pid" && continue
    echo "$pid" > "$CG/cgroup.procs" 2>/dev/null && n=$((n+1))
  done
  echo $n
}
moved=$(sweep)
echo $((CAP * 1000)) > "$CG/cpu.cfs_quota_us"
( while sleep 3; do sweep >/dev/null; done ) &
sweeper=$!
lift() { kill "$sweeper" 2>/dev/null; echo -1 > "$CG/cpu.cfs_quota_us"; }
child=
trap lift EXIT
# the command runs in the background so that a signal reaches this script at once (bash holds
# traps while a foreground command runs): it is passed on, and the cap lifted on the way out
# (SIGTERM either way: a background command of a script ignores SIGINT)
stop() { [ -n "$child" ] && kill -TERM "$child" 2>/dev/null; wait "$child" 2>/dev/null; exit "$1"; }
trap "stop 130" INT
trap "stop 143" TERM
echo "quiet-measure: $moved processes capped at ${CAP}% of a CPU (new ones swept every 3 s); running: $*" >&2
"$@" &
child=$!
wait "$child"
rc=$?
lift
echo "quiet-measure: cap lifted" >&2
exit $rc
