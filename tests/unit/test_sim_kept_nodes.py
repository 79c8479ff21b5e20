"""The simulated sysfs keeps the nodes a device's or mdev's fixed fields decide across model changes
(``SimFs._kept_nodes``) instead of building them again after each change. This proves the kept tree is the tree:
after every step of seeded random changes (the writes a tool makes: create and remove mdevs, VFs on and off,
driver binds, overrides, vGPU 17 types, NUMA, reset methods, reboots, nvidia-smi's MIG commands), a walk of the
whole tree through a SimFs that keeps nodes equals one through a SimFs on the same model that builds every node
anew: every path, its kind, mode, text or link target, and each read's or write's error."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from vgpuvirt.sim.fs import SimFs
from vgpuvirt.sim.model import SimModel
from vgpuvirt.sim.profiles import load_profile
from vgpuvirt.sim.tools import run_tool


class BuildsEverything(SimFs):
    """The reference: every node built at each listing, as before nodes were kept."""

    def _kept_nodes(self, kind: str, owner: Any, other: object, make: Any) -> Any:
        return make()


def walk(fs: SimFs) -> dict[str, tuple[Any, ...]]:
    """Every entry below /sys and /proc: (kind, mode, text or target or errno)."""
    out: dict[str, tuple[Any, ...]] = {}
    stack = ["/sys", "/proc"]
    while stack:
        d = stack.pop()
        for name in fs.listdir(d):
            p = f"{d}/{name}"
            kind, mode = fs.stat(p)
            if kind == "l":
                out[p] = (kind, fs.readlink(p))
            elif kind == "d":
                out[p] = (kind,)
                stack.append(p)
            else:
                try:
                    out[p] = (kind, mode, fs.read(p))
                except OSError as exc:
                    out[p] = (kind, mode, exc.errno)
    return out


def writable(tree: dict[str, tuple[Any, ...]]) -> list[str]:
    return sorted(p for p, v in tree.items() if v[0] == "f" and v[1] & 0o222)


def value_for(path: str, tree: dict[str, tuple[Any, ...]], rng: random.Random) -> str:
    """A value a tool would write to this attribute (sometimes a wrong one: the refusal must read alike too)."""
    name = path.rsplit("/", 1)[1]
    addrs = sorted({p.split("/")[5] for p in tree if p.startswith("/sys/bus/pci/devices/")})
    if name == "create":
        return str(uuid.UUID(int=rng.getrandbits(128)))
    if name == "sriov_numvfs":
        total = tree.get(path.rsplit("/", 1)[0] + "/sriov_totalvfs", ("f", 0, "0\n"))[2]
        return rng.choice(["0", str(min(4, int(total) if isinstance(total, str) else 0)), "1"])
    if name in ("bind", "unbind", "drivers_probe"):
        return rng.choice(addrs)
    if name == "driver_override":
        return rng.choice(["vfio-pci", "nvidia", "\n"])
    if name == "current_vgpu_type":
        listed = tree.get(path.rsplit("/", 1)[0] + "/creatable_vgpu_types", ("f", 0, ""))[2]
        numbers = [line.split(":")[0].strip() for line in str(listed).splitlines()[1:]]
        return rng.choice([*numbers, "0"]) if numbers else "0"
    if name == "reset_method":
        return rng.choice(["default", "flr", "bus", ""])
    return rng.choice(["1", "0", "default", "x"])


# the two largest trees are walked in the slow lane (CI runs it; the inner loop keeps five profiles)
PROFILES = ["t4x2", pytest.param("a100-sriov", marks=pytest.mark.slow), "l40s-vgpu17", "l4-hetero", "gvtg",
            "a30-mig", pytest.param("mixed", marks=pytest.mark.slow)]


@pytest.mark.parametrize("profile", PROFILES)
def test_the_kept_tree_reads_as_a_tree_built_anew_after_every_change(profile: str) -> None:
    rng = random.Random(f"kept-{profile}")
    model = SimModel(load_profile(profile))
    kept, anew = SimFs(model), BuildsEverything(model)
    tree = walk(kept)                               # each walk fills what the kept SimFs keeps, before a change
    assert tree == walk(anew)
    changed = 0
    for step in range(40):
        roll = rng.random()
        version = model.version
        if roll < 0.06:
            model.reboot()
        elif roll < 0.12 and model.gpus:
            gpu = rng.randrange(len(model.gpus))
            run_tool(model, ["nvidia-smi", "-i", str(gpu), "-mig", rng.choice(["0", "1"])], "")
            run_tool(model, ["nvidia-smi", "mig", "-i", str(gpu), "-cgi", "19", "-C"], "")
        else:
            creates = [p for p in writable(tree) if p.endswith("/create")]
            path = rng.choice(creates) if creates and roll < 0.5 else rng.choice(writable(tree))
            try:
                kept.write(path, value_for(path, tree, rng))
            except OSError:
                pass
        changed += model.version != version
        tree, built = walk(kept), walk(anew)
        assert tree == built, (step, sorted(set(tree.items()) ^ set(built.items()))[:6])
    assert all(kept._alive(owner) for owner, _ in kept._kept.values())   # a gone device's nodes are not held
    assert changed >= 8, f"only {changed} of the steps changed the model: the steps test too little"
