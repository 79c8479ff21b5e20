#!/bin/bash
# How often a two-host plan crashes under CPU load: the figure behind tests/unit/test_xml_threads.py.
# Each host's domains are parsed in a thread of their own; with one lxml parser shared by the threads the
# process died ("double free or corruption", SIGSEGV) in 10-16 of 100 runs on a 2-core machine under load.
#
#   scripts/stress_multi_host_plan.sh [RUNS] [BUSY_LOOPS]     (defaults 100 and 3; needs .venv)
set -u
runs=${1:-100} busy=${2:-3}
cli=("$(dirname "$0")/../.venv/bin/vgpuvirt")
pids=()
for _ in $(seq 1 "$busy"); do (while :; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
crashes=0
for _ in $(seq 1 "$runs"); do
    "${cli[@]}" --host sim:t4x2@a --host sim:t4x2@b plan --connect test:///default --connect test:///default \
        --count 4 --policy spread --json >/dev/null 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || { crashes=$((crashes + 1)); echo "run exited $rc" >&2; }
done
echo "crashes: $crashes of $runs two-host plans, with $busy busy loops beside them"
