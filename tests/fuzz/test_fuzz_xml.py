"""The XML builders and readers against any input: build_domain (every template, DomainOptions), the hostdev
classes, and Domain.from_xml / lint / device_from_element on arbitrary and mutated XML.

A build either returns a domain whose XML parses back (and, for the shipped templates, passes libvirt's
RelaxNG schema when asked to validate) or is refused with a one-line InvalidSpec/XmlError.
"""

from __future__ import annotations

from typing import Any

import pytest
from fuzzkit import anything, count, fuzz_settings, junk_text, mutated_xml, refuses_cleanly
from hypothesis import given
from hypothesis import strategies as st

from vgpuvirt.xml import (
    TEMPLATES,
    Disk,
    Domain,
    DomainOptions,
    HostdevInterface,
    MdevHostdev,
    PciHostdev,
    build_domain,
    device_from_element,
    lint,
)

UUIDS = ["83b8f4f2-509f-382f-3c1e-e6bfe0fa1001", "a1b2c3d4-0000-4000-8000-000000000001"]
PCIS = ["0000:3b:00.0", "0000:3b:00.1", "0000:41:00.4", "01:00.0"]

option_fields = st.fixed_dictionaries({}, optional={
    "graphics": st.one_of(st.sampled_from(["spice", "vnc", "none", None]), anything()),
    "graphics_listen": st.one_of(st.just("0.0.0.0"), junk_text(20)),
    "secure_boot": st.booleans(), "tpm": st.booleans(), "hyperv": st.one_of(st.none(), st.booleans()),
    "hyperv_vendor_id": st.one_of(st.none(), st.just("vgpuvirt"), anything()),
    "kvm_hidden": st.booleans(), "hugepages": st.one_of(st.none(), st.booleans()),
    "host_passthrough": st.one_of(st.none(), st.booleans()),
    "threads_per_core": st.one_of(st.integers(0, 9), anything()),
    "disable_arch_capabilities": st.booleans(), "virtio_input": st.one_of(st.none(), st.booleans()),
    "evdev": st.one_of(st.just(()), st.lists(junk_text(30), max_size=2).map(tuple)),
    "machine": st.one_of(st.none(), st.sampled_from(["q35", "pc-q35-8.2", "pc"]), anything()),
    "numa_mode": st.one_of(st.sampled_from(["strict", "preferred", "interleave"]), anything()),
})

mdevs = st.lists(st.builds(lambda u, d, r, b: (u, d, r, b), st.one_of(st.sampled_from(UUIDS), anything()),
                           st.booleans(), st.booleans(), st.one_of(st.none(), st.integers(-1, 3), anything())),
                 max_size=2, unique_by=lambda t: repr(t[0]))
pcis = st.lists(st.builds(lambda a, m, f: (a, m, f), st.one_of(st.sampled_from(PCIS), anything()), st.booleans(),
                          st.one_of(st.none(), junk_text(20))), max_size=2, unique_by=lambda t: repr(t[0]))
nics = st.lists(st.builds(lambda a, mac, v: (a, mac, v), st.one_of(st.sampled_from(["0000:5e:02.0"]), anything()),
                          st.one_of(st.none(), st.just("52:54:00:aa:bb:cc"), anything()),
                          st.one_of(st.none(), st.integers(-1, 5000), anything())), max_size=1)


def _parts(ms: list[Any], ps: list[Any], ns: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
    # each constructor is itself fuzzed: it refuses or returns a value; refused ones are left out
    m_out = [v for u, d, r, b in ms
             if (v := refuses_cleanly(lambda u=u, d=d, r=r, b=b: MdevHostdev(u, display=d, ramfb=r, boot_order=b)))]
    p_out = [v for a, m, f in ps
             if (v := refuses_cleanly(lambda a=a, m=m, f=f: PciHostdev(a, managed=m, rom_file=f)))]
    n_out = [v for a, mac, vl in ns
             if (v := refuses_cleanly(lambda a=a, mac=mac, vl=vl: HostdevInterface(a, mac=mac, vlan=vl)))]
    return m_out, p_out, n_out


@pytest.mark.slow
@fuzz_settings(700)
@given(template=st.sampled_from(sorted(TEMPLATES)), name=st.one_of(st.just("vm-1"), anything()),
       memory=st.one_of(st.integers(-1, 1 << 22), anything()), vcpus=st.one_of(st.integers(-1, 9), anything()),
       uuid=st.one_of(st.none(), st.sampled_from(UUIDS), anything()), opts=option_fields,
       ms=mdevs, ps=pcis, ns=nics, disk=st.one_of(st.none(), st.tuples(junk_text(30), anything())),
       numa=st.one_of(st.none(), st.integers(-1, 4), anything()), validate=st.booleans())
def test_build_domain(template: str, name: Any, memory: Any, vcpus: Any, uuid: Any, opts: dict[str, Any],
                      ms: list[Any], ps: list[Any], ns: list[Any], disk: Any, numa: Any, validate: bool) -> None:
    count("xml:build_domain")
    options = refuses_cleanly(lambda: DomainOptions(**opts))
    m, p, n = _parts(ms, ps, ns)
    d = None if disk is None else refuses_cleanly(lambda: Disk(disk[0], disk[1]) if isinstance(disk[1], str)
                                                  else Disk(disk[0]))
    dom = refuses_cleanly(lambda: build_domain(template, name=name, memory_mib=memory, vcpus=vcpus, uuid=uuid,
                                               mdevs=m, pci=p, nics=n, disk=d, numa_node=numa, options=options,
                                               validate=validate))
    if dom is not None:
        again = Domain.from_xml(dom.to_xml())
        assert again.name == str(name)
        assert len(again.hostdevs()) == len(m) + len(p) + len(n)


@fuzz_settings(700)
@given(text=st.one_of(mutated_xml(), mutated_xml(), junk_text(200), st.binary(max_size=200).map(bytes.hex),
                      st.binary(max_size=300)),
       host_cpus=st.one_of(st.none(), st.frozensets(st.integers(0, 8), max_size=4)))
def test_lint_and_read_any_xml(text: str | bytes, host_cpus: frozenset[int] | None) -> None:
    count("xml:lint/from_xml")
    dom = refuses_cleanly(lambda: Domain.from_xml(text))
    if dom is None:
        return
    problems = refuses_cleanly(lambda: lint(dom, host_cpus))
    assert problems is None or all("\n" not in str(p) for p in problems)
    for el in dom.root.iter("hostdev", "interface"):
        dev = refuses_cleanly(lambda el=el: device_from_element(el))
        if dev is not None:
            assert device_from_element(dev.to_element()) == dev
    refuses_cleanly(lambda: dom.gpu_devices().to_dict())
