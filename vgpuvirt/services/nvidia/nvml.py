"""NVML enrichment through pynvml (``nvidia-ml-py``), for the host we run on only.

NVML describes the machine the process runs on, so the inventory asks it only for a LocalHost reading the
real ``/`` (e.g. inside an Ansible module on the GPU host). Every query is wrapped: on a driver without vGPU
support the vGPU calls answer ``NVMLError_NotSupported``, which is normal and is recorded per GPU in
``not_supported``; any other NVML error is recorded in ``errors``. Nothing here raises for a query failure.

``pynvml`` may be injected (``module=``) so that tests run against a fake built from real facts.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, TypeVar

from vgpuvirt.errors import InvalidSpec, MissingDependency
from vgpuvirt.model import PciAddress
from vgpuvirt.services.nvidia.smi import NvidiaGpuFacts

T = TypeVar("T")

VIRTUALIZATION_MODES = {0: "None", 1: "Pass-Through", 2: "VGPU", 3: "Host VGPU", 4: "Host VSGA"}
HOST_VGPU_MODES = {0: "Non SR-IOV", 1: "SR-IOV"}
FEATURE_STATE = {0: "Disabled", 1: "Enabled"}
#: ``nvmlDeviceGetBrand`` -> the words ``nvidia-smi -q -x`` prints in ``<product_brand>`` (14 -> "NVIDIA" seen on
#: a real H100, R580; the others follow nvml.h's enum names, INFERRED).
BRANDS = {1: "Quadro", 2: "Tesla", 3: "NVS", 4: "Grid", 5: "GeForce", 6: "Titan",
          7: "NVIDIA Virtual Applications", 8: "NVIDIA Virtual PC", 9: "NVIDIA Virtual Compute Server",
          10: "NVIDIA RTX Virtual Workstation", 11: "NVIDIA Cloud Gaming", 12: "Quadro RTX", 13: "NVIDIA RTX",
          14: "NVIDIA", 15: "GeForce RTX", 16: "Titan RTX"}
#: ``nvmlDeviceGetArchitecture`` -> ``<product_architecture>`` (9 -> "Hopper" seen on a real H100 and H200).
ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere", 8: "Ada Lovelace",
                 9: "Hopper", 10: "Blackwell"}
_MIB = 1024 * 1024
_NO_GI_PROFILE = 0xFFFFFFFF


@dataclass(frozen=True)
class NvmlReport:
    available: bool
    driver_version: str | None = None
    gpus: list[NvidiaGpuFacts] = field(default_factory=list)
    error: str | None = None


def load_pynvml(*, required: bool) -> ModuleType | None:
    """Import pynvml; missing -> None, or :class:`MissingDependency` naming the ``nvml`` extra if required."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        if required:
            raise MissingDependency("pynvml", "nvml", "NVML enrichment (use_nvml=True)") from exc
        return None


def nvml_text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class _Query:
    """Runs NVML calls for one GPU, sorting failures into NotSupported / other errors."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.not_supported: list[str] = []
        self.errors: dict[str, str] = {}

    def __call__(self, key: str, fn: Callable[[], T]) -> T | None:
        try:
            return fn()
        except self.nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self.nvml.NVML_ERROR_NOT_SUPPORTED:
                if key not in self.not_supported:
                    self.not_supported.append(key)
            else:
                self.errors[key] = str(exc)
            return None


def _type_info(nvml: Any, q: _Query, handle: Any, type_id: int) -> dict[str, Any]:
    name = q(f"vgpu_type[{type_id}].name", lambda: nvml_text(nvml.nvmlVgpuTypeGetName(type_id)))
    klass = q(f"vgpu_type[{type_id}].class", lambda: nvml_text(nvml.nvmlVgpuTypeGetClass(type_id)))
    fb = q(f"vgpu_type[{type_id}].framebuffer", lambda: int(nvml.nvmlVgpuTypeGetFramebufferSize(type_id)))
    max_inst = q(f"vgpu_type[{type_id}].max_instances",
                 lambda: int(nvml.nvmlVgpuTypeGetMaxInstances(handle, type_id)))
    heads = q(f"vgpu_type[{type_id}].num_heads", lambda: int(nvml.nvmlVgpuTypeGetNumDisplayHeads(type_id)))
    gi = q(f"vgpu_type[{type_id}].gpu_instance_profile",
           lambda: int(nvml.nvmlVgpuTypeGetGpuInstanceProfileId(type_id)))
    return {"id": int(type_id), "name": name, "class": klass,
            "framebuffer_mib": fb // (1024 * 1024) if fb is not None else None,
            "max_instances": max_inst, "num_heads": heads,
            "gpu_instance_profile_id": gi if gi is not None and gi != _NO_GI_PROFILE else None}


def _active_info(nvml: Any, q: _Query, inst: int) -> dict[str, Any]:
    vm = q(f"vgpu_instance[{inst}].vm_id", lambda: nvml.nvmlVgpuInstanceGetVmID(inst))
    mdev = q(f"vgpu_instance[{inst}].mdev_uuid", lambda: nvml_text(nvml.nvmlVgpuInstanceGetMdevUUID(inst)))
    return {
        "instance": int(inst),
        "type_id": q(f"vgpu_instance[{inst}].type", lambda: int(nvml.nvmlVgpuInstanceGetType(inst))),
        "uuid": q(f"vgpu_instance[{inst}].uuid", lambda: nvml_text(nvml.nvmlVgpuInstanceGetUUID(inst))) or None,
        "mdev_uuid": (mdev or "").lower() or None,
        # pynvml returns (bytes, int) here: its str-decoding decorator does not look inside tuples.
        "vm_id": nvml_text(vm[0]) if vm else None,
        "gpu_instance_id": q(f"vgpu_instance[{inst}].gpu_instance_id",
                             lambda: int(nvml.nvmlVgpuInstanceGetGpuInstanceId(inst))),
    }


@dataclass(frozen=True)
class FbMemory:
    """The framebuffer in MiB with ONE meaning of "used" whatever the source: allocated memory, NOT counting
    what the driver and firmware reserve (``reserved``, reported apart). ``nvidia-smi -q -x`` prints it so
    (``<used>0 MiB</used>``, ``<reserved>480 MiB</reserved>`` on an idle H100, R580), and so does NVML's
    ``nvmlDeviceGetMemoryInfo_v2``; the v1 call counts the reserved memory as used (480 MiB on that H100)."""

    total: int | None
    used: int | None
    reserved: int | None


def fb_memory(nvml: Any, handle: Any) -> FbMemory | None:
    """Read the framebuffer through the v2 call (reserved apart); a pynvml or driver without it gives v1's
    numbers with the reserved part unknown (None) and still counted in ``used``. None if NVML refuses both."""
    version = getattr(nvml, "nvmlMemory_v2", None)
    if version is not None:
        try:
            m = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            return FbMemory(int(m.total) // _MIB, int(m.used) // _MIB, int(m.reserved) // _MIB)
        except (nvml.NVMLError, TypeError, AttributeError):
            pass   # an older driver: no _v2 entry point (NVMLError FunctionNotFound) -> v1
    try:
        m = nvml.nvmlDeviceGetMemoryInfo(handle)
    except nvml.NVMLError:
        return None
    return FbMemory(int(m.total) // _MIB, int(m.used) // _MIB, None)


def handle_address(nvml: Any, handle: Any) -> PciAddress | None:
    info = nvml.nvmlDeviceGetPciInfo(handle)
    bus_id = getattr(info, "busId", None)
    if bus_id:
        try:
            return PciAddress.from_nvml(nvml_text(bus_id))
        except InvalidSpec:
            pass
    try:
        return PciAddress(int(info.domain) & 0xFFFF, int(info.bus), int(info.device), 0)
    except (AttributeError, InvalidSpec, TypeError, ValueError):
        return None


def _gpu_facts(nvml: Any, handle: Any) -> NvidiaGpuFacts:
    q = _Query(nvml)
    address = q("pci_info", lambda: handle_address(nvml, handle))
    mem = q("memory_info", lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
    # an older pynvml lacks the architecture call: the fact is then unknown, not an error
    brand = q("brand", lambda: int(nvml.nvmlDeviceGetBrand(handle))) if hasattr(nvml, "nvmlDeviceGetBrand") else None
    arch = (q("architecture", lambda: int(nvml.nvmlDeviceGetArchitecture(handle)))
            if hasattr(nvml, "nvmlDeviceGetArchitecture") else None)
    virt = q("virtualization_mode", lambda: int(nvml.nvmlDeviceGetVirtualizationMode(handle)))
    host_mode = q("host_vgpu_mode", lambda: int(nvml.nvmlDeviceGetHostVgpuMode(handle)))
    hetero = q("vgpu_heterogeneous_mode", lambda: int(nvml.nvmlDeviceGetVgpuHeterogeneousMode(handle)))
    mig = q("mig_mode", lambda: list(nvml.nvmlDeviceGetMigMode(handle)))
    # ECC mode [current, pending]: what -q -x prints in <ecc_mode>; a migration needs it equal on both hosts
    ecc = (q("ecc_mode", lambda: [int(m) for m in nvml.nvmlDeviceGetEccMode(handle)])
           if hasattr(nvml, "nvmlDeviceGetEccMode") else None)
    supported = q("supported_vgpus", lambda: [int(t) for t in nvml.nvmlDeviceGetSupportedVgpus(handle)])
    creatable = q("creatable_vgpus", lambda: [int(t) for t in nvml.nvmlDeviceGetCreatableVgpus(handle)])
    active = q("active_vgpus", lambda: [int(i) for i in nvml.nvmlDeviceGetActiveVgpus(handle)])
    type_infos = {t: _type_info(nvml, q, handle, t) for t in (supported or [])}
    return NvidiaGpuFacts(
        source="nvml",
        address=address,
        product_name=q("name", lambda: nvml_text(nvml.nvmlDeviceGetName(handle))),
        product_brand=BRANDS.get(brand) if brand is not None else None,
        architecture=ARCHITECTURES.get(arch) if arch is not None else None,
        uuid=q("uuid", lambda: nvml_text(nvml.nvmlDeviceGetUUID(handle))),
        memory_total_mib=int(mem.total) // (1024 * 1024) if mem is not None else None,
        virtualization_mode=VIRTUALIZATION_MODES.get(virt, str(virt)) if virt is not None else None,
        host_vgpu_mode=HOST_VGPU_MODES.get(host_mode, str(host_mode)) if host_mode is not None else None,
        vgpu_heterogeneous_mode=FEATURE_STATE.get(hetero, str(hetero)) if hetero is not None else None,
        mig_mode_current=FEATURE_STATE.get(mig[0]) if mig else None,
        mig_mode_pending=FEATURE_STATE.get(mig[1]) if mig and len(mig) > 1 else None,
        mig_devices=_mig_devices(nvml, q, handle, mig),
        ecc_mode_current=FEATURE_STATE.get(ecc[0]) if ecc else None,
        supported_vgpu_types=[type_infos[t] for t in supported] if supported is not None else None,
        creatable_vgpu_types=([type_infos.get(t) or {"id": t, "name": None} for t in creatable]
                              if creatable is not None else None),
        active_vgpus=[_active_info(nvml, q, i) for i in active] if active is not None else None,
        not_supported=q.not_supported,
        errors=q.errors,
    )


def _mig_devices(nvml: Any, q: _Query, handle: Any, mig: list[Any] | None) -> int | None:
    """How many MIG devices the GPU has now, as ``-q -x`` counts its ``<mig_device>`` elements: none while MIG
    is off (the real H100's NVML inventory said "unknown" where nvidia-smi said 0)."""
    if not mig:
        return None
    if int(mig[0]) == 0:
        return 0
    if not hasattr(nvml, "nvmlDeviceGetMaxMigDeviceCount"):
        return None
    most = q("max_mig_device_count", lambda: int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)))
    if most is None:
        return None
    count = 0
    for i in range(most):
        try:
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError:      # NOT_FOUND: no MIG device at this index
            continue
        count += 1
    return count


def collect(nvml: Any) -> NvmlReport:
    """Ask NVML about every GPU it sees (on SR-IOV hosts these are the PFs; VFs are not NVML devices)."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # No driver / no libnvidia-ml: a normal state for a host without an NVIDIA GPU.
        return NvmlReport(available=False, error=str(exc))
    try:
        try:
            driver = nvml_text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            driver = None
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as exc:
            return NvmlReport(available=False, driver_version=driver, error=str(exc))
        gpus: list[NvidiaGpuFacts] = []
        for i in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
            except nvml.NVMLError as exc:
                gpus.append(NvidiaGpuFacts(source="nvml", address=None, errors={"handle": str(exc)}))
                continue
            gpus.append(_gpu_facts(nvml, handle))
        return NvmlReport(available=True, driver_version=driver, gpus=gpus)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass
