#!/usr/bin/env bash
# The README's first command. On a fresh Debian 12 machine, as root:
#     git clone ... vgpuvirt && cd vgpuvirt && scripts/demo.sh
# 1. installs what vgpuvirt needs (apt packages, .venv with vgpuvirt[all,dev]) through
#    `scripts/testbed.sh install` (idempotent; set VGPUVIRT_DEMO_SKIP_INSTALL=1 to skip it);
# 2. runs the main job on the embedded default, with no GPU and no daemon: inventory of a simulated
#    2 x Tesla T4 host, placement (with --explain), vGPU creation on the simulated host, domain XML,
#    define + start on libvirt's test driver, and a summary table.
# Extra arguments go to `vgpuvirt provision` (e.g. --count 12 --policy spread, or --json).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VGPUVIRT_VENV:-$REPO/.venv}
cd "$REPO"

if [ "${VGPUVIRT_DEMO_SKIP_INSTALL:-0}" != 1 ]; then
  scripts/testbed.sh install
fi

vgpuvirt() { "$VENV/bin/vgpuvirt" "$@"; }

echo "== what the simulated host offers"
vgpuvirt --host sim:t4x2 types --available | head -n 20 || true

echo "== the plan (a dry run: nothing changes)"
vgpuvirt --host sim:t4x2 plan --connect test:///default --count 4 --gpu 'fb>=2G,series=Q'

echo "== the main job"
vgpuvirt --host sim:t4x2 provision --connect test:///default --count 4 --gpu 'fb>=2G,series=Q' --explain "$@"
