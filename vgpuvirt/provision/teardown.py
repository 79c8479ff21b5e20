"""Teardown: destroy + undefine the named domains and remove the vGPUs vgpuvirt created for them.

Only domains that carry vgpuvirt's metadata are touched (a foreign domain of the same name is
reported and left alone), and only the devices that metadata lists are removed. Disks are kept
unless ``remove_storage=True``. Per host: the libvirt calls, then ONE read and ONE batch for all
of the host's vGPUs. Rerunning is harmless: what is already gone is reported as such.
"""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from vgpuvirt.errors import VgpuvirtError
from vgpuvirt.host.base import Host
from vgpuvirt.libvirt_conn import LibvirtConnection
from vgpuvirt.provision.apply import _conn_for, _hosts_by_name
from vgpuvirt.provision.steps import HostStep, step_from_meta
from vgpuvirt.services.mutation import apply_items
from vgpuvirt.xml.provenance import Provenance


@dataclass
class TeardownResult:
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    disks_removed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_dict(self) -> dict[str, Any]:
        return {"removed": self.removed, "skipped": self.skipped, "failed": self.failed,
                "disks_removed": self.disks_removed, "seconds": round(self.seconds, 3)}


def _selected(name: str, names: set[str] | None, patterns: Sequence[str]) -> bool:
    if names is not None and name in names:
        return True
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def teardown(hosts: Host | Sequence[Host] | Mapping[str, Host],
             conn: LibvirtConnection | Mapping[str, LibvirtConnection], names: Iterable[str] | None = None, *,
             patterns: Sequence[str] = (), remove_storage: bool = False, dry_run: bool = False,
             progress: Callable[[str, str], None] | None = None, wait_timeout: float = 10.0) -> TeardownResult:
    """Remove the VMs named (or matching a glob in ``patterns``) that vgpuvirt made on these hosts."""
    by_name = _hosts_by_name(hosts)
    wanted = set(names) if names is not None else None
    if wanted is None and not patterns:
        wanted = set()
    result = TeardownResult()
    t0 = time.monotonic()
    found: set[str] = set()

    def one(hname: str) -> TeardownResult:
        r = TeardownResult()
        host = by_name[hname]
        c = _conn_for(conn, hname)
        devices: list[HostStep] = []
        for d in c.domains():
            if not _selected(d.name, wanted, patterns):
                continue
            prov = Provenance.read(d.xml)
            if prov is None:
                found.add(d.name)
                r.skipped.append(f"{hname}: domain {d.name} was not created by vgpuvirt; left alone")
                continue
            if prov.host not in (hname, None):
                continue  # another host's VM on a shared libvirt (test:///default)
            found.add(d.name)
            if dry_run:
                r.removed.append(f"{hname}: would destroy and undefine {d.name}")
            else:
                try:
                    if c.destroy(d.name):
                        r.removed.append(f"{hname}: destroyed {d.name}")
                    r.disks_removed += c.undefine(d.name, remove_storage=remove_storage)
                    r.removed.append(f"{hname}: undefined {d.name}")
                except VgpuvirtError as exc:
                    r.failed.append(f"{hname}: {d.name}: {exc}")
                    continue
            if progress is not None:
                progress(hname, d.name)
            for g in prov.gpus:
                made = step_from_meta(hname, d.name, g)
                if made is not None:
                    devices.append(made)
        if devices:
            try:
                snap = host.read([s.state_path() for s in devices])
                present = [s for s in devices if s.happened(snap)]
                for s in devices:
                    if s not in present:
                        r.skipped.append(f"{hname}: vGPU {s.target} already gone")
                if present and dry_run:
                    r.removed += [f"{hname}: would remove vGPU {s.target}" for s in present]
                elif present:
                    outcomes = apply_items(host, [s.undo_item(wait_timeout) for s in present], on_error="continue")
                    for s, out in zip(present, outcomes, strict=True):
                        if out.ok:
                            r.removed.append(f"{hname}: {s.undone()}")
                        else:
                            r.failed.append(f"{hname}: vGPU {s.target}: {out.error}")
            except VgpuvirtError as exc:
                r.failed.append(f"{hname}: removing vGPUs: {exc}")
        return r

    with ThreadPoolExecutor(max_workers=max(1, len(by_name)), thread_name_prefix="vgpuvirt-teardown") as pool:
        for r in pool.map(one, list(by_name)):
            result.removed += r.removed
            result.skipped += r.skipped
            result.failed += r.failed
            result.disks_removed += r.disks_removed
    for n in sorted((wanted or set()) - found):
        result.skipped.append(f"domain {n} not found (already removed)")
    result.seconds = time.monotonic() - t0
    return result
