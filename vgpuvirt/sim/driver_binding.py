"""The simulated PCI driver core: bind, unbind, probe, driver_override, new_id/remove_id."""

from __future__ import annotations

import errno

from vgpuvirt.sim import kstrto
from vgpuvirt.sim.devices import Dev, ModelCore
from vgpuvirt.sim.kstrto import oserror


class DriverBinding:
    """Driver binding as ``/sys/bus/pci/drivers/*`` and ``drivers_probe`` do it (a :class:`SimModel` mixin)."""

    def _matches(self: ModelCore, drv: str, dev: Dev) -> bool:
        if dev.override is not None:
            return drv == dev.override
        if drv == dev.native_driver:
            return True
        return (dev.spec.vendor, self.device_id(dev)) in self.dynids.get(drv, set())

    def device_id(self: ModelCore, dev: Dev) -> int:
        if dev.physfn is not None and dev.spec.sriov is not None:
            return dev.spec.sriov.vf_device
        return dev.spec.device

    def _attach(self: ModelCore, drv: str, dev: Dev) -> None:
        dev.driver = drv
        dev.vendor_type = 0
        dev.vendor_gi = None
        self.bump()

    def _detach(self: ModelCore, dev: Dev) -> None:
        # The driver's remove(): an mdev parent unregisters (its mdevs go), a PF disables its VFs.
        for m in self.mdevs_of(dev.addr):
            del self.mdevs[m.uuid]
        if dev.numvfs:
            self._disable_vfs(dev)
        dev.driver = None
        dev.vendor_type = 0
        dev.vendor_gi = None
        self.bump()

    def bind(self: ModelCore, drv: str, raw: str) -> None:
        """``/sys/bus/pci/drivers/<drv>/bind`` (bus.c bind_store)."""
        dev = self.devices.get(kstrto.sysfs_streq(raw))
        if dev is None or not self._matches(drv, dev):
            raise oserror(errno.ENODEV)
        if dev.driver is not None:
            raise oserror(errno.EBUSY)
        self._attach(drv, dev)

    def unbind(self: ModelCore, drv: str, raw: str) -> None:
        dev = self.devices.get(kstrto.sysfs_streq(raw))
        if dev is None or dev.driver != drv:
            raise oserror(errno.ENODEV)
        self._detach(dev)

    def probe(self: ModelCore, raw: str) -> None:
        """``/sys/bus/pci/drivers_probe``: attach the first matching loaded driver; none is not an error."""
        dev = self.devices.get(kstrto.sysfs_streq(raw))
        if dev is None:
            raise oserror(errno.ENODEV)
        if dev.driver is not None:
            return
        candidates = [dev.override] if dev.override is not None else [dev.native_driver, *sorted(self.dynids)]
        for drv in candidates:
            if drv is not None and drv in self.drivers and self._matches(drv, dev):
                self._attach(drv, dev)
                return

    def set_override(self: ModelCore, dev: Dev, raw: str) -> None:
        """driver_set_override(): cut at the first newline; empty clears; the device is not rebound."""
        if len(raw.encode("utf-8")) >= 4095:
            raise oserror(errno.EINVAL)
        value = raw.split("\n", 1)[0]
        dev.override = value or None
        self.bump()

    def new_id(self: ModelCore, drv: str, raw: str) -> None:
        """``new_id``: "vendor device [...]" in hex; then the driver attaches to matching unbound devices."""
        fields = raw.split()
        try:
            vendor, device = int(fields[0], 16), int(fields[1], 16)
        except (IndexError, ValueError):
            raise oserror(errno.EINVAL) from None
        self.dynids.setdefault(drv, set()).add((vendor, device))
        self.bump()
        for dev in self.devices.values():
            if dev.driver is None and self._matches(drv, dev):
                self._attach(drv, dev)

    def remove_id(self: ModelCore, drv: str, raw: str) -> None:
        fields = raw.split()
        try:
            key = (int(fields[0], 16), int(fields[1], 16))
        except (IndexError, ValueError):
            raise oserror(errno.EINVAL) from None
        ids = self.dynids.get(drv, set())
        if key not in ids:
            raise oserror(errno.ENODEV)
        ids.discard(key)
        self.bump()
