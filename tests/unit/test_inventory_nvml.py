"""NVML enrichment against a fake ``pynvml`` built from the hostdata facts (tests/fixtures/hostdata) (no GPU here).

The fake mirrors pynvml's real surface: the same function names, ``NVMLError(value)`` returning the
per-code subclass (``NVMLError_NotSupported``), byte strings where the C API hands back char buffers,
``nvmlVgpuInstanceGetVmID`` returning ``(bytes, int)``.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

import pytest

from vgpuvirt.errors import MissingDependency
from vgpuvirt.host.base import Entry, Snapshot
from vgpuvirt.services.inventory.read import build_inventory
from vgpuvirt.services.nvidia import nvml as nvml_mod

NOT_SUPPORTED, NOT_FOUND, LIBRARY_NOT_FOUND, INVALID_ARGUMENT = 3, 6, 12, 2


@dataclass
class FakeGpu:
    bus_id: bytes
    name: bytes
    memory_total: int
    virt_mode: int
    host_vgpu_mode: int | None          # None -> NotSupported
    mig: list[int] | None               # None -> NotSupported
    supported: list[int] | None         # None -> NotSupported (non-vGPU driver)
    creatable: list[int] | None = None
    active: list[int] | None = None
    mdev_of: dict[int, bytes] = field(default_factory=dict)


def make_pynvml(gpus: list[FakeGpu], type_table: dict[int, dict[str, Any]], *, init_error: int | None = None
                ) -> types.ModuleType:
    m = types.ModuleType("pynvml")

    class NVMLError(Exception):
        _map: dict[int, type] = {}

        def __new__(cls, value: int) -> NVMLError:
            klass = NVMLError._map.get(value, cls) if cls is NVMLError else cls
            obj = Exception.__new__(klass)
            obj.value = value  # type: ignore[attr-defined]
            return obj  # type: ignore[return-value]

        def __init__(self, value: int) -> None:
            super().__init__(value)

        def __str__(self) -> str:
            return {3: "Not Supported", 6: "Not Found", 12: "NVML Shared Library Not Found",
                    2: "Invalid Argument"}.get(self.value, "Unknown Error")  # type: ignore[attr-defined]

    for code, name in ((3, "NotSupported"), (6, "NotFound"), (12, "LibraryNotFound"), (2, "InvalidArgument")):
        sub = type(f"NVMLError_{name}", (NVMLError,), {})
        NVMLError._map[code] = sub
        setattr(m, f"NVMLError_{name}", sub)
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_ERROR_NOT_SUPPORTED = NOT_SUPPORTED  # type: ignore[attr-defined]
    state = {"init": False, "shutdown": 0}
    m.state = state  # type: ignore[attr-defined]

    def need_init() -> None:
        if not state["init"]:
            raise NVMLError(1)

    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["init"] = True

    def nvmlShutdown() -> None:
        state["shutdown"] += 1

    def get(h: int) -> FakeGpu:
        need_init()
        return gpus[h]

    def maybe(value: Any) -> Any:
        if value is None:
            raise NVMLError(NOT_SUPPORTED)
        return value

    def type_field(t: int, key: str) -> Any:
        need_init()
        if t not in type_table:
            raise NVMLError(INVALID_ARGUMENT)
        return type_table[t][key]

    inst_type: dict[int, int] = {}
    inst_mdev: dict[int, bytes] = {}
    for g in gpus:
        for i in g.active or []:
            inst_type[i] = g.creatable[0] if g.creatable else 0
            inst_mdev[i] = g.mdev_of.get(i, b"")

    def inst(i: int) -> int:
        need_init()
        if i not in inst_type:
            raise NVMLError(NOT_FOUND)
        return i

    m.__dict__.update(
        nvmlInit=nvmlInit, nvmlShutdown=nvmlShutdown,
        nvmlSystemGetDriverVersion=lambda: b"535.161.05",
        nvmlDeviceGetCount=lambda: (need_init(), len(gpus))[1],
        nvmlDeviceGetHandleByIndex=lambda i: (need_init(), i)[1],
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=get(h).bus_id, domain=0, bus=0, device=0),
        nvmlDeviceGetName=lambda h: get(h).name.decode(),
        nvmlDeviceGetUUID=lambda h: f"GPU-fake-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=get(h).memory_total, used=0, free=0),
        nvmlDeviceGetVirtualizationMode=lambda h: get(h).virt_mode,
        nvmlDeviceGetHostVgpuMode=lambda h: maybe(get(h).host_vgpu_mode),
        nvmlDeviceGetVgpuHeterogeneousMode=lambda h: maybe(None if get(h).supported is None else 0),
        nvmlDeviceGetMigMode=lambda h: maybe(get(h).mig),
        nvmlDeviceGetSupportedVgpus=lambda h: list(maybe(get(h).supported)),
        nvmlDeviceGetCreatableVgpus=lambda h: list(maybe(get(h).creatable if get(h).supported is not None else None)),
        nvmlDeviceGetActiveVgpus=lambda h: list(maybe(get(h).active if get(h).supported is not None else None)),
        nvmlVgpuTypeGetName=lambda t: type_field(t, "name"),
        nvmlVgpuTypeGetClass=lambda t: type_field(t, "class"),
        nvmlVgpuTypeGetFramebufferSize=lambda t: type_field(t, "fb_mib") * 1024 * 1024,
        nvmlVgpuTypeGetMaxInstances=lambda h, t: (get(h), type_field(t, "max"))[1],
        nvmlVgpuTypeGetNumDisplayHeads=lambda t: type_field(t, "heads"),
        nvmlVgpuTypeGetGpuInstanceProfileId=lambda t: type_field(t, "gi"),
        nvmlVgpuInstanceGetType=lambda i: inst_type[inst(i)],
        nvmlVgpuInstanceGetUUID=lambda i: (inst(i), "")[1],
        nvmlVgpuInstanceGetMdevUUID=lambda i: inst_mdev[inst(i)].decode(),
        nvmlVgpuInstanceGetVmID=lambda i: (inst(i), (b"7f1c0d5e-0000-4000-8000-00000000abcd", 1))[1],
        nvmlVgpuInstanceGetGpuInstanceId=lambda i: (inst(i), maybe(None))[1],
    )
    return m


# Facts from nvidia_t4_sysfs.txt (T4 types) and nvml_nvidia_smi.txt (modes, NotSupported behaviour).
T4_TYPES = {
    231: {"name": b"GRID T4-2Q".decode(), "class": "Quadro", "fb_mib": 2048, "max": 8, "heads": 4, "gi": 0xFFFFFFFF},
    232: {"name": "GRID T4-4Q", "class": "Quadro", "fb_mib": 4096, "max": 4, "heads": 4, "gi": 0xFFFFFFFF},
    222: {"name": "GRID T4-1B", "class": "NVS", "fb_mib": 1024, "max": 16, "heads": 4, "gi": 0xFFFFFFFF},
}


def vgpu_host() -> types.ModuleType:
    return make_pynvml([
        FakeGpu(b"00000000:3B:00.0", b"Tesla T4", 16 * 2**30, 3, 0, None, [222, 231, 232], creatable=[231],
                active=[3251634190], mdev_of={3251634190: b"A1B2C3D4-0000-4000-8000-000000000001"}),
        FakeGpu(b"00000000:D8:00.0", b"Tesla T4", 16 * 2**30, 3, 0, None, [222, 231, 232],
                creatable=[222, 231, 232], active=[]),
    ], T4_TYPES)


def bare_metal_h100() -> types.ModuleType:
    return make_pynvml([FakeGpu(b"00000000:1B:00.0", b"NVIDIA H100 80GB HBM3", 80 * 2**30, 0, None, [0, 0], None)],
                       {})


def test_vgpu_host_facts() -> None:
    report = nvml_mod.collect(vgpu_host())
    assert report.available and report.driver_version == "535.161.05"
    g0, g1 = report.gpus
    assert str(g0.address) == "0000:3b:00.0" and g0.product_name == "Tesla T4" and g0.memory_total_mib == 16384
    assert (g0.virtualization_mode, g0.host_vgpu_mode) == ("Host VGPU", "Non SR-IOV")
    assert g0.mig_mode_current is None and "mig_mode" in g0.not_supported
    assert [t["name"] for t in g0.supported_vgpu_types or []] == ["GRID T4-1B", "GRID T4-2Q", "GRID T4-4Q"]
    t231 = next(t for t in g0.supported_vgpu_types or [] if t["id"] == 231)
    assert t231 == {"id": 231, "name": "GRID T4-2Q", "class": "Quadro", "framebuffer_mib": 2048, "max_instances": 8,
                    "num_heads": 4, "gpu_instance_profile_id": None}
    assert [t["id"] for t in g0.creatable_vgpu_types or []] == [231]
    (active,) = g0.active_vgpus or []
    assert active["mdev_uuid"] == "a1b2c3d4-0000-4000-8000-000000000001"
    assert active["vm_id"] == "7f1c0d5e-0000-4000-8000-00000000abcd" and active["type_id"] == 231
    assert active["gpu_instance_id"] is None                 # time-sliced: no GI
    assert g1.active_vgpus == [] and not g1.errors


def test_not_supported_on_a_bare_metal_driver_is_normal() -> None:
    module = bare_metal_h100()
    report = nvml_mod.collect(module)
    (g,) = report.gpus
    assert report.available and g.virtualization_mode == "None" and not g.vgpu_host
    assert g.supported_vgpu_types is None and g.creatable_vgpu_types is None and g.active_vgpus is None
    assert {"supported_vgpus", "creatable_vgpus", "active_vgpus", "host_vgpu_mode"} <= set(g.not_supported)
    assert g.errors == {}
    assert (g.mig_mode_current, g.mig_mode_pending) == ("Disabled", "Disabled")
    assert module.state["shutdown"] == 1  # type: ignore[attr-defined]


def test_no_driver_means_unavailable_not_an_exception() -> None:
    report = nvml_mod.collect(make_pynvml([], {}, init_error=LIBRARY_NOT_FOUND))
    assert not report.available and report.error == "NVML Shared Library Not Found" and report.gpus == []


def test_missing_pynvml_raises_only_when_required(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_pynvml(name: str, *a: Any, **kw: Any) -> Any:
        if name == "pynvml":
            raise ImportError("No module named 'pynvml'")
        return real_import(name, *a, **kw)

    monkeypatch.delitem(__import__("sys").modules, "pynvml", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    monkeypatch.setattr(nvml_mod.importlib, "import_module", lambda n: no_pynvml(n))
    assert nvml_mod.load_pynvml(required=False) is None
    with pytest.raises(MissingDependency, match=r"vgpuvirt\[nvml\]"):
        nvml_mod.load_pynvml(required=True)


def test_nvml_facts_enrich_the_inventory_and_name_vendor_types() -> None:
    snap = Snapshot({
        "/sys/bus/pci/devices/0000:3b:00.0/class": Entry("file", text="0x030200\n"),
        "/sys/bus/pci/devices/0000:3b:00.0/vendor": Entry("file", text="0x10de\n"),
        "/sys/bus/pci/devices/0000:d8:00.0/class": Entry("file", text="0x030200\n"),
        "/sys/bus/pci/devices/0000:d8:00.0/vendor": Entry("file", text="0x10de\n"),
    })
    inv = build_inventory(snap, host="local", nvml=nvml_mod.collect(vgpu_host()))
    assert inv.sources["nvml"] == "ok" and inv.nvidia_driver_version == "535.161.05"
    assert [g.name for g in inv.gpus] == ["Tesla T4", "Tesla T4"]
    d = inv.to_dict()["gpus"][0]["nvidia"]
    assert d["source"] == "nvml" and d["virtualization_mode"] == "Host VGPU"
    assert d["not_supported"] == ["mig_mode", "vgpu_instance[3251634190].gpu_instance_id"]


def test_real_pynvml_has_every_function_the_code_calls() -> None:
    pynvml = pytest.importorskip("pynvml")
    import inspect

    src = inspect.getsource(nvml_mod)
    import re

    called = set(re.findall(r"nvml\.(nvml[A-Za-z_]+)\(", src))
    assert called and all(hasattr(pynvml, name) for name in called), called - set(dir(pynvml))
    assert pynvml.NVML_ERROR_NOT_SUPPORTED == NOT_SUPPORTED
    assert type(pynvml.NVMLError(NOT_SUPPORTED)).__name__ == "NVMLError_NotSupported"


def test_mig_devices_are_counted_as_nvidia_smi_counts_them() -> None:
    # the real H100 (MIG off): nvidia-smi's -q -x said 0 MIG devices, NVML's inventory said null
    (off,) = nvml_mod.collect(bare_metal_h100()).gpus
    assert off.mig_devices == 0
    on = bare_metal_h100()
    on.nvmlDeviceGetMigMode = lambda h: [1, 1]
    on.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7
    present = {0, 3}                                   # two MIG devices, at indices 0 and 3

    def by_index(h: int, i: int) -> str:
        if i not in present:
            raise on.NVMLError(NOT_FOUND)
        return f"mig-{i}"

    on.nvmlDeviceGetMigDeviceHandleByIndex = by_index
    (gpu,) = nvml_mod.collect(on).gpus
    assert gpu.mig_devices == 2
    del on.nvmlDeviceGetMaxMigDeviceCount             # an older pynvml: unknown, not a guess
    (gpu,) = nvml_mod.collect(on).gpus
    assert gpu.mig_devices is None
