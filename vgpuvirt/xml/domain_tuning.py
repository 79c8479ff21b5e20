"""Tuning a domain: CPU pinning, NUMA, hugepages, CPU model and topology, hypervisor features, secure boot."""

from __future__ import annotations

from vgpuvirt.errors import InvalidSpec
from vgpuvirt.xml.document import DomainTree
from vgpuvirt.xml.element import Element, make, sub
from vgpuvirt.xml.parts import CpuPinning


class DomainTuning(DomainTree):
    """The CPU, memory and feature settings of a :class:`~vgpuvirt.xml.domain.Domain`."""

    def set_cpu_pinning(self, pinning: CpuPinning | None) -> None:
        tune = self.child("cputune")
        if tune is not None:
            for el in list(tune):
                if el.tag in ("vcpupin", "emulatorpin"):
                    tune.remove(el)
        if pinning is None:
            if tune is not None and len(tune) == 0:
                self.root.remove(tune)
            return
        tune = self._ensure("cputune")
        new = pinning.to_element()
        for i, el in enumerate(new):
            tune.insert(i, el)

    def cpu_pinning(self) -> CpuPinning | None:
        tune = self.child("cputune")
        if tune is None or tune.find("vcpupin") is None:
            return None
        return CpuPinning.from_element(tune)

    def set_numa_node(self, node: int | None, mode: str = "strict") -> None:
        old = self.child("numatune")
        if old is not None:
            self.root.remove(old)
        if node is None:
            return
        if not isinstance(node, int) or isinstance(node, bool) or not 0 <= node <= 1023:
            raise InvalidSpec("NUMA node", node, "an integer 0..1023")
        if mode not in ("strict", "preferred", "interleave", "restrictive"):
            raise InvalidSpec("numatune mode", mode, "strict | preferred | interleave | restrictive")
        tune = self._ensure("numatune")
        sub(tune, "memory", {"mode": mode, "nodeset": str(node)})

    def set_hugepages(self, on: bool) -> None:
        backing = self.child("memoryBacking")
        if backing is not None:
            for el in backing.findall("hugepages"):
                backing.remove(el)
        if on:
            sub(self._ensure("memoryBacking"), "hugepages")
        elif backing is not None and len(backing) == 0:
            self.root.remove(backing)

    def set_cpu_mode(self, host_passthrough: bool) -> None:
        cpu = self._ensure("cpu")
        if host_passthrough:
            for k, v in (("mode", "host-passthrough"), ("check", "none"), ("migratable", "off")):
                cpu.set(k, v)
        else:
            cpu.attrib.clear()
            cpu.set("mode", "host-model")
            cpu.set("check", "partial")
            for el in list(cpu):
                if el.tag in ("cache", "feature"):
                    cpu.remove(el)

    def set_topology(self, vcpus: int, threads: int = 1) -> None:
        if not isinstance(threads, int) or threads < 1 or vcpus % threads:
            raise InvalidSpec("threads per core", threads, f"a divisor of the vCPU count {vcpus}")
        cpu = self._ensure("cpu")
        topo = cpu.find("topology")
        if topo is None:
            topo = make("topology")
            cpu.insert(0, topo)
        for k, v in (("sockets", "1"), ("dies", "1"), ("cores", str(vcpus // threads)), ("threads", str(threads))):
            topo.set(k, v)

    def set_cpu_feature(self, name: str, policy: str | None) -> None:
        cpu = self._ensure("cpu")
        for el in cpu.findall(f"feature[@name='{name}']"):
            cpu.remove(el)
        if policy is not None:
            sub(cpu, "feature", {"policy": policy, "name": name})

    def features(self) -> Element:
        return self._ensure("features")

    def set_hyperv(self, on: bool, vendor_id: str | None = None) -> None:
        """Hyper-V enlightenments on/off (the template's list is kept), plus an optional vendor_id."""
        feats = self.features()
        hv = feats.find("hyperv")
        if not on:
            if hv is not None:
                feats.remove(hv)
            if vendor_id is not None:
                raise InvalidSpec("hyperv_vendor_id", vendor_id, "Hyper-V enabled (hyperv=True)")
            self._set_hypervclock(False)
            return
        if hv is None:
            hv = sub(feats, "hyperv", {"mode": "custom"})
            for name in ("relaxed", "vapic", "vpindex", "synic", "stimer", "frequencies"):
                sub(hv, name, {"state": "on"})
        for el in hv.findall("vendor_id"):
            hv.remove(el)
        if vendor_id is not None:
            sub(hv, "vendor_id", {"state": "on", "value": vendor_id})
        self._set_hypervclock(True)

    def _set_hypervclock(self, on: bool) -> None:
        clock = self.child("clock")
        if clock is None:
            if not on:
                return
            clock = self._ensure("clock")
            clock.set("offset", "localtime")
        for el in clock.findall("timer[@name='hypervclock']"):
            clock.remove(el)
        if on:
            sub(clock, "timer", {"name": "hypervclock", "present": "yes"})

    def set_kvm_hidden(self, hidden: bool) -> None:
        feats = self.features()
        for el in feats.findall("kvm"):
            feats.remove(el)
        if hidden:
            sub(sub(feats, "kvm"), "hidden", {"state": "on"})

    def set_secure_boot(self, on: bool) -> None:
        """UEFI with firmware auto-selection; secure boot with Microsoft keys enrolled needs SMM."""
        os_el = self._ensure("os")
        os_el.set("firmware", "efi")
        fw = os_el.find("firmware")
        if fw is None:
            fw = make("firmware")
            t = os_el.find("type")
            os_el.insert(0 if t is None else os_el.index(t) + 1, fw)
        for el in list(fw):
            fw.remove(el)
        sub(fw, "feature", {"enabled": "yes" if on else "no", "name": "secure-boot"})
        if on:
            sub(fw, "feature", {"enabled": "yes", "name": "enrolled-keys"})
        feats = self.features()
        for el in feats.findall("smm"):
            feats.remove(el)
        if on:
            sub(feats, "smm", {"state": "on"})
