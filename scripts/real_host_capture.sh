#!/bin/bash
# Record a real GPU host, read-only, with this checkout of vgpuvirt: `vgpuvirt capture` (plain and --redact),
# every read-only verb as text and JSON with its exit status, and the project's benchmarks that run on a GPU host:
# the CLI's whole-process start (bench_cli_start.py --local), where an inventory's time goes (bench_nvml_read.py),
# the agent's own start (bench_agent_exec.py), and the import profile of the common verbs. Nothing is written
# to sysfs, no MIG mode is changed, no GPU is reset: only verbs that read.
#
#   scripts/real_host_capture.sh OUTDIR          (as root on the GPU host, from the repository's root)
#
# OUTDIR gets capture.json, capture-redacted.json and real-host.tar.gz (everything else). The CLI runs from
# this checkout (PYTHONPATH), so a host needs only python3 and vgpuvirt's dependencies.
set -u
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out"
work=$(mktemp -d)
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python3}
cli=("$py" -m vgpuvirt --host local)

step() {   # step NAME CMD...: stdout to NAME, stderr to NAME.err, exit status and seconds to status.txt
    local name=$1; shift
    local t0 t1 rc
    t0=$(date +%s%N)
    timeout 60 "$@" >"$work/$name" 2>"$work/$name.err"; rc=$?
    t1=$(date +%s%N)
    printf '%-28s rc=%-3s %6d ms  %s\n' "$name" "$rc" $(( (t1 - t0) / 1000000 )) "$*" | tee -a "$work/status.txt"
}

{ date -u; uname -r; "$py" --version; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,mig.mode.current,pci.bus_id --format=csv;
  git rev-parse HEAD 2>/dev/null; "$py" -c 'import lxml, yaml, rich, prometheus_client; print("deps ok")'
  "$py" -c 'import pynvml; print("pynvml", pynvml.__file__)'; } >"$work/env.txt" 2>&1

step capture.out "${cli[@]}" capture -o "$out/capture.json"
step capture-redacted.out "${cli[@]}" capture --redact -o "$out/capture-redacted.json"
for verb in inventory types metrics "mig show" "scheduler show" "layout export" "sriov show" "mdev list" \
            "iommu check 0000:00:06.0" "gc" "host status" "vm list" "audit show" "top --once" \
            "plan --gpu fb>=2048 --no-start" "plan --gpu passthrough --no-start" "plan --gpu mig=1g.10gb --no-start"; do
    name=$(printf %s "$verb" | tr -c "A-Za-z0-9.\n-" _)
    step "$name.txt" "${cli[@]}" $verb
    [ "${verb%% *}" = "top" ] || step "$name.json" "${cli[@]}" --json $verb
done
step layout-export-mig-parted.txt "${cli[@]}" layout export --format mig-parted
# the capture replayed on the same machine: what a test here will compare with the live answers above
for verb in inventory types "mig show" "scheduler show" metrics; do
    step "replay_${verb// /_}.json" "$py" -m vgpuvirt --host "capture:$out/capture.json" --json $verb
done

# whole-process start times (issue 25), 20 interleaved runs each; then where an inventory's time goes
step cli-start.txt "$py" benchmarks/bench_cli_start.py --runs 20 --local
step bench_nvml_read.txt "$py" benchmarks/bench_nvml_read.py --repeat 20
step bench_agent_exec.txt "$py" benchmarks/bench_agent_exec.py --rounds 20 --python "$py"
step importtime-help.txt "$py" -X importtime -m vgpuvirt --help
step importtime-inventory.txt "$py" -X importtime -m vgpuvirt --json inventory
step importtime-metrics.txt "$py" -X importtime -m vgpuvirt --json metrics

tar -C "$work" -czf "$out/real-host.tar.gz" .
cat "$work/status.txt" "$work/env.txt" "$work/cli-start.txt" "$work/bench_nvml_read.txt" "$work/bench_agent_exec.txt"
