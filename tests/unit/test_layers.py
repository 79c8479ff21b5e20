"""The house rules of DESIGN.md that code can check: imports point down (no cycle; model and xml import no
host, libvirt, paramiko or pynvml), and modules stay small enough to read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "vgpuvirt"
MAX_LINES = 410         # being replaced by the class-split and private-name rules (#23)
BIG_ON_PURPOSE = {"vgpuvirt.host.agent"}      # shipped to hosts as one file (python3 >= 3.6, stdlib only)


def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        name = ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _top_level_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """What a module imports when it is loaded (not inside functions, not under ``if TYPE_CHECKING``)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vgpuvirt"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("vgpuvirt"))
    return {m for m in found if m in modules}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    # A package's __init__ re-exporting its submodules is not an arrow between layers.
    return {m: {t for t in _top_level_imports(p, mods) if t != m and not t.startswith(m + ".")}
            for m, p in mods.items()}


def test_no_import_cycle() -> None:
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append([*path[path.index(t):], t])
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_model_and_xml_stay_at_the_bottom() -> None:
    graph = _graph()
    low = [m for m in graph if m in ("vgpuvirt.model", "vgpuvirt.usage", "vgpuvirt.errors", "vgpuvirt.layout.model",
                                     "vgpuvirt.layout.schema") or m.startswith("vgpuvirt.xml")]
    for m in low:
        up = {t for t in graph[m] if t.startswith(("vgpuvirt.host", "vgpuvirt.services", "vgpuvirt.change",
                                                   "vgpuvirt.provision",
                                                   "vgpuvirt.cli", "vgpuvirt.libvirt_conn"))}
        assert not up, f"{m} imports {sorted(up)}"
        text = _modules()[m].read_text()
        for lib in ("import libvirt", "import paramiko", "import pynvml"):
            assert lib not in text, f"{m}: {lib}"


def test_modules_stay_small() -> None:
    big = {m: n for m, p in _modules().items()
           if m not in BIG_ON_PURPOSE and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_the_change_engine_sits_below_the_verbs() -> None:
    """change/ runs what services plan (it imports services, host, xml, libvirt); provision, layouts and the CLI
    build on it, never the other way round."""
    graph = _graph()
    for m in (m for m in graph if m.startswith("vgpuvirt.change")):
        up = {t for t in graph[m] if t.startswith(("vgpuvirt.provision", "vgpuvirt.layout", "vgpuvirt.cli",
                                                   "vgpuvirt.observe", "vgpuvirt.sim"))}
        assert not up, f"{m} imports {sorted(up)}"
