"""The boot unit: the files ``layout install-boot`` writes (the systemd unit, its program, the shipped scripts);
the undo puts back what was there (the files' old text, or no file)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import ClassVar

from vgpuvirt.change.step import HostFacts, HostStep
from vgpuvirt.host.base import OpResult
from vgpuvirt.services import host_files
from vgpuvirt.services.mutation import Planned


@dataclass(frozen=True)
class InstallBootUnit(HostStep):
    """Write ``files`` (path -> {"text", "mode"} or {"link"}, as JSON text: a frozen value) under ``prefix``. The
    installer prints each file's previous state before writing: the undo is learned from that answer, even when the
    install failed part-way."""

    kind: ClassVar[str] = "install-boot-unit"
    rank: ClassVar[int] = 90            # after the devices it keeps across reboots exist
    undo_learned: ClassVar[bool] = True
    host: str
    vm: str
    files: str
    prefix: str = "/"

    @property
    def target(self) -> str:
        return self.prefix

    def spec(self) -> host_files.Files:
        out: host_files.Files = json.loads(self.files)
        return out

    def describe(self) -> str:
        return f"install the boot unit ({len(self.spec())} files under {self.prefix})"

    def details(self) -> dict[str, str]:
        return {"prefix": self.prefix, "files": ",".join(sorted(self.spec()))}

    def done_in(self, facts: HostFacts) -> bool:
        return False        # the files are written each time: the program is read from the host as it is now

    def item(self, wait_timeout: float) -> Planned:
        return host_files.install_item(self.host, self.spec(), self.prefix)

    def undo_item(self, wait_timeout: float) -> Planned | None:
        return None         # what was there is known from the installer's answer only

    def undo_from(self, results: tuple[OpResult, ...], wait_timeout: float) -> Planned | None:
        before = host_files.previous(results)
        return host_files.install_item(self.host, before, self.prefix) if before is not None else None

    def undone(self) -> str:
        return f"put the files under {self.prefix} back as they were (removed those that were not there)"
