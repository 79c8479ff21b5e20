#!/bin/bash
# Record a real GPU host, read-only, with this checkout of vgpuvirt: `vgpuvirt capture` (plain and --redact),
# every read-only verb as text and JSON with its exit status, the whole-process start times of the CLI there,
# the agent's own start there, and the import profile of the common verbs. Nothing is written to sysfs, no MIG
# mode is changed, no GPU is reset: only verbs that read.
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

# whole-process start times (issue 25): 20 interleaved runs each
"$py" - "$work" <<'EOF' >"$work/cli-start.txt" 2>&1
import os, statistics, subprocess, sys, time
cmds = [("python3 -c pass", [sys.executable, "-c", "pass"]),
        ("python3 -S -c pass", [sys.executable, "-S", "-c", "pass"]),
        ("vgpuvirt --help", [sys.executable, "-m", "vgpuvirt", "--help"]),
        ("vgpuvirt --json inventory (local)", [sys.executable, "-m", "vgpuvirt", "--json", "inventory"]),
        ("vgpuvirt --json metrics (local)", [sys.executable, "-m", "vgpuvirt", "--json", "metrics"]),
        ("vgpuvirt --json types (local)", [sys.executable, "-m", "vgpuvirt", "--json", "types"]),
        ("vgpuvirt --json --host sim:t4x2 inventory", [sys.executable, "-m", "vgpuvirt", "--json", "--host", "sim:t4x2", "inventory"]),
        ("nvidia-smi -L", ["nvidia-smi", "-L"]),
        ("nvidia-smi --query-gpu=6 fields", ["nvidia-smi", "--query-gpu=name,pci.bus_id,memory.total,memory.used,utilization.gpu,mig.mode.current", "--format=csv"])]
env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
def run(argv):
    t0 = time.perf_counter(); subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); return time.perf_counter() - t0
for _, argv in cmds: run(argv)
s = {n: [] for n, _ in cmds}
for _ in range(20):
    for n, argv in cmds: s[n].append(run(argv))
b = min(s[cmds[0][0]])
print(f"20 interleaved runs, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
for n, v in s.items():
    print(f"{n:45s} best {min(v)*1000:7.1f} ms  median {statistics.median(v)*1000:7.1f} ms  ({min(v)/b:.2f}x python -c pass)")
EOF
step inventory-inprocess.txt "$py" -c '
import statistics, time
from vgpuvirt.host.local import LocalHost
from vgpuvirt.services.inventory.read import inventory
h = LocalHost()
for label, kw in (("NVML (facts, readings, dmesg)", {"use_nvml": True}), ("nvidia-smi -q -x", {"use_nvml": False}),
                  ("sysfs only", {"use_nvml": False, "nvidia_smi": False})):
    inventory(h, **kw)
    t = []
    for _ in range(20):
        t0 = time.perf_counter(); inv = inventory(h, **kw); t.append(time.perf_counter() - t0)
    print(f"in-process inventory, {label:30s} best {min(t)*1000:7.2f} ms  median {statistics.median(t)*1000:7.2f} ms"
          f"  health={[g.health is not None for g in inv.gpus]}")
'
step bench_nvml_read.txt "$py" benchmarks/bench_nvml_read.py --repeat 20
step bench_agent_exec.txt "$py" benchmarks/bench_agent_exec.py --rounds 20 --python "$py"
step importtime-help.txt "$py" -X importtime -m vgpuvirt --help
step importtime-inventory.txt "$py" -X importtime -m vgpuvirt --json inventory
step importtime-metrics.txt "$py" -X importtime -m vgpuvirt --json metrics

tar -C "$work" -czf "$out/real-host.tar.gz" .
cat "$work/status.txt" "$work/env.txt" "$work/cli-start.txt" "$work/inventory-inprocess.txt" "$work/bench_nvml_read.txt" "$work/bench_agent_exec.txt"
