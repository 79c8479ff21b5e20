"""Shared by the rollback tests: the whole state of a simulated host as one comparable value, and a failure
injected into the LAST mutating op of a batch (what a change's last step meets when the kernel or a tool
refuses it).

``host_state(host)`` reads everything a change may touch (the PCI device tree with its driver links, VF links
and vGPU type files, the mdev bus, /etc/modprobe.d and vgpuvirt's own files, the nvidia module parameters) and
what nvidia-smi says of MIG (modes, GPU and compute instances): two equal values mean the host is as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from vgpuvirt.errors import TransportError
from vgpuvirt.host.base import BatchResult, Op, OpResult
from vgpuvirt.sim import SimHost

#: what a change may touch on a simulated host
STATE_GLOBS = ("/sys/bus/pci/devices/*/*", "/sys/bus/pci/devices/*/nvidia/*", "/sys/bus/mdev/devices/*",
               "/sys/bus/pci/devices/*/*/*/mdev_type", "/etc/modprobe.d/*", "/etc/vgpuvirt/*", "/etc/vgpuvirt/*/*",
               "/var/lib/vgpuvirt/*", "/var/lib/vgpuvirt/*/*", "/sys/module/nvidia/parameters/*")
#: files that change by themselves (counters, clocks) and say nothing of what a change did
VOLATILE = ("/power/", "/statistics/", "/aer_", "/irq", "/resource", "/config")
MIG_ARGVS = (["nvidia-smi", "--query-gpu=pci.bus_id,mig.mode.current,mig.mode.pending", "--format=csv"],
             ["nvidia-smi", "mig", "-lgi"], ["nvidia-smi", "mig", "-lci"])


def host_state(host: SimHost) -> dict[str, Any]:
    snap = host.read(list(STATE_GLOBS))
    files = {p: (e.kind, e.text, e.target) for p, e in snap.items() if not any(v in p for v in VOLATILE)}
    mig = [(r.exit_code, r.stdout) for r in (host.run(a) for a in MIG_ARGVS)]
    return {"files": files, "mig": mig}


def diff(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs, one line each (empty: the host is as before)."""
    out = [f"{p}: {before['files'].get(p)} -> {after['files'].get(p)}"
           for p in sorted(set(before["files"]) | set(after["files"]))
           if before["files"].get(p) != after["files"].get(p)]
    if before["mig"] != after["mig"]:
        out.append(f"MIG: {before['mig']} -> {after['mig']}")
    return out


@contextmanager
def fail_last(host: SimHost, match: Callable[[Op], bool], *, errno: int = 5,
              stderr: str = "injected failure") -> Iterator[list[Op]]:
    """In the first mutating batch holding an op that ``match`` es, the LAST such op fails (errno for a write,
    exit 1 with ``stderr`` for an exec): the ops before it run for real, the rest are skipped. Yields the list
    of ops that were failed (one, or none when no batch matched)."""
    inner = host.apply
    failed: list[Op] = []

    def apply(ops: Sequence[Op], **kw: Any) -> BatchResult:
        hits = [i for i, o in enumerate(ops) if o.mutates and match(o)]
        if failed or not hits:
            return inner(ops, **kw)
        k = hits[-1]
        done = inner(list(ops[:k]), **kw).results if k else ()
        if any(not r.ok for r in done):           # an earlier op failed for real: the batch stops there
            return BatchResult((*done, *(OpResult(o, False, skipped=True) for o in ops[k:])))
        failed.append(ops[k])
        bad = (OpResult(ops[k], False, rc=1, stderr=stderr, error=stderr) if ops[k].op == "exec"
               else OpResult(ops[k], False, errno=errno, error=stderr))
        return BatchResult((*done, bad, *(OpResult(o, False, skipped=True) for o in ops[k + 1:])))

    host.apply = apply  # type: ignore[method-assign]
    try:
        yield failed
    finally:
        host.apply = inner  # type: ignore[method-assign]


class CutSimHost(SimHost):
    """A SimHost whose connection 'drops' on the n-th writing batch, before or after the batch ran;
    with ``stay_down`` every later call fails too until ``down`` is cleared."""

    cut_at: int | None = None
    cut_after_running: bool = True
    stay_down: bool = False
    down: bool = False
    _writes = 0

    def _exchange(self, request: dict[str, Any], *, idempotent: bool) -> dict[str, Any]:
        if self.down:
            raise TransportError(self.name, "connection refused: simulated outage")
        if any(o.get("op") == "write" for o in request.get("ops") or ()):
            self._writes += 1
            if self._writes == self.cut_at:
                if self.cut_after_running:
                    super()._exchange(request, idempotent=idempotent)
                self.down = self.stay_down
                raise TransportError(self.name, "connection lost: simulated cut")
        return super()._exchange(request, idempotent=idempotent)
