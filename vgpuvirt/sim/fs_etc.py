"""The simulated ``/etc/modprobe.d``, ``/sys/module/nvidia`` and ``/proc/driver/nvidia`` (the driver's version and
its loaded parameters, the registry options among them), ``/proc/cmdline``, and the NVML calls of the agent's
``nvml`` op: the parts of :class:`~vgpuvirt.sim.fs.SimFs` that play the vGPU scheduler's host side (state in
:mod:`vgpuvirt.sim.scheduler`)."""

from __future__ import annotations

import errno
import re
from typing import Any

from vgpuvirt.sim.devices import gpu_uuid
from vgpuvirt.sim.fs_nodes import Attr, Dir, Node
from vgpuvirt.sim.kstrto import oserror
from vgpuvirt.sim.model import SimModel

MODPROBE_DIR = "/etc/modprobe.d"
STATE_DIR = "/var/lib/vgpuvirt"
#: The simulated package database: ``driver_version`` there is the vGPU manager installed on disk.
PACKAGE_DIR = "/var/lib/vgpuvirt-sim"
DRIVER_FILE = f"{PACKAGE_DIR}/driver_version"
_DRIVER_VERSION = re.compile(r"^[0-9]{1,4}(\.[0-9]{1,4}){1,3}\Z")


def check_driver_version(text: str) -> str:
    """A vGPU manager version as nvidia-smi prints it (``580.95.05``); anything else is refused."""
    v = text.strip()
    if not _DRIVER_VERSION.match(v):
        raise ValueError(f"not a driver version: {text!r} (expected digits and dots, e.g. 580.95.05)")
    return v


class EtcTree:
    model: SimModel

    def _etc(self) -> dict[str, Node]:
        files = self.model.sched.modprobe
        return {"modprobe.d": Dir(lambda: {name: Attr(show=lambda n=name: files[n], mode=0o644)  # type: ignore[misc]
                                           for name in sorted(files)})}

    def _module(self) -> dict[str, Node]:
        # The driver registers its parameters with permission 0: no parameters/ file shows them (they are in
        # /proc/driver/nvidia/params); /sys/module/nvidia/version is there (real H100, R580).
        if "nvidia" not in self.model.drivers:
            return {}
        version = Attr(show=lambda: self.model.driver_version + "\n", mode=0o444)
        return {"nvidia": Dir(lambda: {"version": version})}

    def _proc_driver(self) -> dict[str, Node]:
        if "nvidia" not in self.model.drivers:
            return {}
        v = self.model.driver_version
        # R580's open kernel module line (real H100); the GCC line is INFERRED from that capture's shape
        version = (f"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {v}  Release Build  (dvs-builder@)  \n"
                   "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n")
        return {"nvidia": Dir(lambda: {
            "version": Attr(show=lambda: version, mode=0o444),
            "params": Attr(show=self.model.sched.proc_params, mode=0o444),
            "gpus": Dir(self._proc_gpus)})}

    def _proc_gpus(self) -> dict[str, Node]:
        out: dict[str, Node] = {}
        for minor, d in enumerate(sorted((d for d in self.model.devices.values()
                                          if d.spec.vendor == 0x10DE and d.physfn is None
                                          and d.spec.pci_class >> 16 == 0x03 and d.driver == "nvidia"),
                                         key=lambda d: d.addr)):
            # the real R580 layout (tabs and all); IRQ, VBIOS and DMA figures are the real H100's, INFERRED for
            # other boards
            text = (f"Model: \t\t {d.spec.product or 'NVIDIA GPU'}\nIRQ:   \t\t {41 + minor}\n"
                    f"GPU UUID: \t {gpu_uuid(d.addr)}\nVideo BIOS: \t 96.00.da.00.0c\nBus Type: \t PCIe\n"
                    "DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
                    f"Bus Location: \t {d.addr}\nDevice Minor: \t {minor}\n"
                    f"GPU Firmware: \t {self.model.driver_version}\nGPU Excluded:\t No\n")
            info: dict[str, Node] = {"information": Attr(show=lambda t=text: t, mode=0o444)}  # type: ignore[misc]
            out[d.addr] = Dir(lambda i=info: i)  # type: ignore[misc]
        return out

    def _cmdline(self) -> str:
        p = self.model.profile
        if p.cmdline:
            return p.cmdline
        # INFERRED: a typical host's boot line, with the IOMMU switched on when the profile has one
        return "BOOT_IMAGE=/boot/vmlinuz root=/dev/sda1 ro quiet" + (" intel_iommu=on iommu=pt" if p.iommu else "")

    def replace_file(self, path: str, value: str, mode: int) -> None:
        """The agent's ``replace_file`` op: only plain file names directly in /etc/modprobe.d and in vgpuvirt's
        state directory exist here."""
        directory, _, name = path.rpartition("/")
        if path == DRIVER_FILE:
            # a package install: the new version waits on disk until the driver is reloaded (a reboot)
            try:
                version = check_driver_version(value)
            except ValueError:
                raise oserror(errno.EINVAL) from None
            with self.model.lock:
                self.model.installed_driver = version
                self.model.bump()
            return
        if directory not in (MODPROBE_DIR, STATE_DIR) or not name or name.startswith("."):
            raise oserror(errno.EROFS)
        with self.model.lock:
            if directory == STATE_DIR:
                self.model.state_files[name] = value
                self.model.bump()
                return
            self.model.sched.modprobe[name] = value
            self.model.bump()

    def remove_file(self, path: str) -> None:
        """The agent's ``remove_file`` op: a file of /etc/modprobe.d or of vgpuvirt's state directory goes (already
        absent is fine)."""
        directory, _, name = path.rpartition("/")
        if directory not in (MODPROBE_DIR, STATE_DIR) or not name or name.startswith("."):
            raise oserror(errno.EROFS)
        with self.model.lock:
            (self.model.state_files if directory == STATE_DIR else self.model.sched.modprobe).pop(name, None)
            self.model.bump()

    def nvml(self, op: dict[str, Any]) -> dict[str, Any]:
        return self.model.sched.nvml(op)
