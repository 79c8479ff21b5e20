"""What mdevs a host has: active ones from a sysfs snapshot, defined ones from ``mdevctl list --defined``."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass
from typing import Any

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.host.base import Snapshot
from vgpuvirt.model import MdevUuid
from vgpuvirt.services.pci import sysfs


@dataclass(frozen=True)
class MdevRecord:
    """One mediated device as the host knows it (active in sysfs and/or defined in mdevctl)."""

    uuid: MdevUuid
    parent: str
    type: str
    active: bool
    defined: bool = False
    start: str | None = None          # mdevctl "auto" | "manual" when defined

    def to_dict(self) -> dict[str, Any]:
        return {"uuid": str(self.uuid), "parent": self.parent, "type": self.type, "active": self.active,
                "defined": self.defined, "start": self.start}


@dataclass(frozen=True)
class Definition:
    parent: str
    type: str
    start: str

def device_path(uuid: MdevUuid) -> str:
    """An mdev's directory (a link) on the mdev bus: it exists exactly while the mdev is active."""
    return sysfs.mdev(uuid)


def active_from_snapshot(snap: Snapshot) -> dict[MdevUuid, tuple[str, str]]:
    """{uuid: (parent, type)} for every ``/sys/bus/mdev/devices/<uuid>`` link in the snapshot."""
    out: dict[MdevUuid, tuple[str, str]] = {}
    for path in snap.glob(f"{sysfs.MDEV_DEVICES}/*"):
        name = posixpath.basename(path)
        try:
            uuid = MdevUuid.parse(name)
        except InvalidSpec:
            continue
        target = snap.link(path)
        # ../../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/<uuid> -> parent is the dir above
        parent = posixpath.basename(posixpath.dirname(target.rstrip("/"))) if target else ""
        out[uuid] = (parent, snap.link_name(f"{path}/mdev_type") or "")
    return out


# mdevctl's JSON nests 6 deep ([{parent: [{uuid: {attrs: [{...}]}}]}]); the host's output is data, and
# json.loads recurses once per level, so a deeper document would end in a RecursionError.
MDEVCTL_JSON_MAX_DEPTH = 32


def _nesting_depth(text: str, limit: int) -> int:
    """The deepest ``[``/``{`` nesting in a JSON text (strings skipped), counting stops past ``limit``."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    break
        elif c in "]}":
            depth -= 1
    return deepest


def parse_mdevctl_defined(text: str) -> dict[MdevUuid, list[Definition]]:
    """``mdevctl list --defined --dumpjson``: ``[{parent: [{uuid: {mdev_type, start, attrs}}]}]``.

    Raises ValueError on anything that is not such JSON, including one nested deeper than
    :data:`MDEVCTL_JSON_MAX_DEPTH`."""
    text = text.strip()
    if not text:
        return {}
    if _nesting_depth(text, MDEVCTL_JSON_MAX_DEPTH) > MDEVCTL_JSON_MAX_DEPTH:
        raise ValueError(f"nested deeper than {MDEVCTL_JSON_MAX_DEPTH} levels")
    data = json.loads(text)
    out: dict[MdevUuid, list[Definition]] = {}
    if not isinstance(data, list):
        return out
    for block in data:
        if not isinstance(block, dict):
            continue
        for parent, devices in block.items():
            for dev in devices if isinstance(devices, list) else []:
                if not isinstance(dev, dict):
                    continue
                for uuid_text, cfg in dev.items():
                    try:
                        uuid = MdevUuid.parse(uuid_text)
                    except InvalidSpec:
                        continue
                    cfg = cfg if isinstance(cfg, dict) else {}
                    out.setdefault(uuid, []).append(
                        Definition(str(parent), str(cfg.get("mdev_type", "")), str(cfg.get("start", "manual"))))
    return out
