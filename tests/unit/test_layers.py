"""The house rules of DESIGN.md that code can check.

* Imports point down: each module imports its own layer or lower ones (``LAYERS``), no import circle between
  vgpuvirt's modules at any level, and model and xml import no host, libvirt, paramiko or pynvml.
* No module imports a private name (``_x``) of another module.
* No class is split across files by inheritance.

Every import counts, wherever it stands: at the top, inside a function (it runs later, but it runs, and a circle
through it is a circle), and under ``if TYPE_CHECKING:`` (it never runs, but the module still depends on the other
for its types: a type-only arrow that points up, or closes a circle, couples the layers as much as a runtime one;
where two modules need each other's types, the shared types move down). Importing ``vgpuvirt.a.b`` first runs the
package ``vgpuvirt/a/__init__.py``, so it is an arrow to that package too; a package's ``__init__`` re-exporting
its own submodules is not an arrow between layers. Modules imported by a name held in a string (the lazy tables
of ``vgpuvirt/__init__.py``, ``xml/__init__.py`` and ``cli/__init__.py``) are not read: each of those tables
names its own package's submodules only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vgpuvirt"


@dataclass(frozen=True)
class Arrow:
    source: str
    target: str
    line: int
    names: tuple[str, ...]        # the names a ``from target import ...`` takes (empty for ``import target``)


# one worker parses every module once for all of this file's tests (~2 s of CPU a parse, each test on another
# worker parsed them again)
pytestmark = pytest.mark.xdist_group("layers")

@cache
def _modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        name = ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(_modules()[module].read_text())


def _absolute(module: str, node: ast.ImportFrom, is_package: bool | None = None) -> str:
    if not node.level:
        return node.module or ""
    if is_package is None:
        is_package = _modules()[module].name == "__init__.py"
    base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _arrows(module: str) -> Iterator[Arrow]:
    return _arrows_in(module, _tree(module), _modules()[module].name == "__init__.py")


def _arrows_in(module: str, tree: ast.Module, is_package: bool) -> Iterator[Arrow]:
    """Every import of a vgpuvirt module in ``module``: ast.walk reaches function bodies and TYPE_CHECKING blocks."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _absolute(module, node, is_package)
            if target.split(".")[0] == "vgpuvirt":
                yield Arrow(module, target, node.lineno, tuple(a.name for a in node.names))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "vgpuvirt":
                    yield Arrow(module, a.name, node.lineno, ())


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


@cache
def _graph() -> dict[str, frozenset[str]]:
    mods = _modules()
    graph: dict[str, frozenset[str]] = {}
    for m in mods:
        targets: set[str] = set()
        for a in _arrows(m):
            # ``from vgpuvirt.x import y`` imports the submodule vgpuvirt.x.y where there is one
            named = [f"{a.target}.{n}" for n in a.names if f"{a.target}.{n}" in mods]
            for t in [a.target, *named]:
                targets.update(x for x in [t, *_ancestors(t)] if x in mods)
        own = set(_ancestors(m))       # a module's own packages are running already when it is imported
        graph[m] = frozenset(t for t in targets if t != m and t not in own and not t.startswith(m + "."))
    return graph


def _circles(graph: dict[str, frozenset[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each a set of modules in a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    graph = _graph()
    circles = _circles(graph)
    described = ["{" + ", ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a] & set(c))) + "}" for c in circles]
    assert not circles, "import circles: " + "; ".join(described)


def test_the_graph_sees_every_kind_of_import() -> None:
    """The reader finds function-level, TYPE_CHECKING and relative imports, and a circle through them."""
    src = ("from typing import TYPE_CHECKING\n"
           "if TYPE_CHECKING:\n    from vgpuvirt.b import B\n"
           "def f():\n    import vgpuvirt.c\n    from . import d\n")
    found = {a.target for a in _arrows_in("vgpuvirt.x.a", ast.parse(src), is_package=False)}
    assert found == {"vgpuvirt.b", "vgpuvirt.c", "vgpuvirt.x"}
    assert _circles({"a": frozenset({"b"}), "b": frozenset({"c"}), "c": frozenset({"a"}), "d": frozenset({"a"})}) \
        == [["a", "b", "c"]]
    assert _circles({"a": frozenset({"b"}), "b": frozenset()}) == []


def test_model_and_xml_stay_at_the_bottom() -> None:
    graph = _graph()
    low = [m for m in graph if m in ("vgpuvirt.model", "vgpuvirt.usage", "vgpuvirt.errors", "vgpuvirt.layout.model",
                                     "vgpuvirt.layout.schema") or m.startswith("vgpuvirt.xml")]
    for m in low:
        up = {t for t in graph[m] if t.startswith(("vgpuvirt.host", "vgpuvirt.services", "vgpuvirt.change",
                                                   "vgpuvirt.provision",
                                                   "vgpuvirt.cli", "vgpuvirt.libvirt_", "vgpuvirt.layout.",
                                                   "vgpuvirt.sim", "vgpuvirt.observe"))
              and t not in low}
        assert not up, f"{m} imports {sorted(up)}"
        text = _modules()[m].read_text()
        for lib in ("import libvirt", "import paramiko", "import pynvml"):
            assert lib not in text, f"{m}: {lib}"


# The layers of DESIGN.md, by the first name under vgpuvirt (a module or a package): an import may point to its
# own layer or a lower one, never up. sim is a Host (the simulator stands in for a host's kernel); layout and
# provision are peers (both plan changes and run them on the one change engine, change/, below them); observe
# watches hosts for the CLI.
LAYERS: dict[str, int] = {
    "errors": 0, "model": 0, "usage": 0, "files": 0, "durable": 0, "audit": 0,
    "xml": 1,
    "host": 2,
    "services": 3, "sim": 3, "libvirt_uri": 3, "libvirt_bound": 3,
    "libvirt_conn": 4, "libvirt_storage": 4,
    "change": 5,
    "provision": 6, "layout": 6,
    "observe": 7, "capture": 7, "hosts": 7, "ansible_support": 7, "testing": 7,
    "cli": 8,
    "__main__": 9, "": 9,
}
# Arrows allowed to point up for now: none (top's terminal rendering moved from observe/ into cli/).
UPWARD_UNTIL_MOVED: set[tuple[str, str]] = set()


def _top(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _layer(module: str) -> int:
    return LAYERS[_top(module)]


def test_every_module_has_a_layer() -> None:
    missing = sorted({_top(m) for m in _modules()} - set(LAYERS))
    assert not missing, f"give these a layer in LAYERS: {missing}"


def test_imports_point_down_the_layers() -> None:
    up = {(m, t) for m, targets in _graph().items() for t in targets if _layer(t) > _layer(m)}
    described = [f"{m} ({_layer(m)}) imports {t} ({_layer(t)})" for m, t in sorted(up - UPWARD_UNTIL_MOVED)]
    assert not described, "imports that point up:\n" + "\n".join(described)
    assert up >= UPWARD_UNTIL_MOVED, f"moved: take them off UPWARD_UNTIL_MOVED: {sorted(UPWARD_UNTIL_MOVED - up)}"


# -- private names ---------------------------------------------------------------------------------------------

def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_uses(module: str) -> Iterator[str]:
    return _private_uses_in(module, _tree(module), _modules()[module].name == "__init__.py", set(_modules()))


def _private_uses_in(module: str, tree: ast.Module, is_package: bool, mods: set[str]) -> Iterator[str]:
    """``from m import _x``, ``import m._x`` and ``m._x`` where ``m`` names another vgpuvirt module in this one.

    The names bound to modules are collected over the whole file (not per scope): a local variable that shadows
    a module's name and has a private attribute is reported too, which errs on the side of a loud failure."""
    bound: dict[str, str] = {}
    for a in _arrows_in(module, tree, is_package):
        node_names = a.names
        for part in a.target.split(".")[1:]:
            if _private(part) and a.target != module:
                yield f"{module}:{a.line} imports the private module {a.target}"
                break
        for n in node_names:
            if _private(n) and a.target != module:
                yield f"{module}:{a.line} imports {a.target}.{n}"
            elif f"{a.target}.{n}" in mods:
                bound[n] = f"{a.target}.{n}"
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _absolute(module, node, is_package).startswith("vgpuvirt"):
            target = _absolute(module, node, is_package)
            for a in node.names:
                if a.asname and f"{target}.{a.name}" in mods:
                    bound[a.asname] = f"{target}.{a.name}"
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("vgpuvirt."):
                    bound[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = ast.unparse(node.value)
            target = bound.get(owner)
            if target is not None and target != module:
                yield f"{module}:{node.lineno} uses {target}.{node.attr}"


def test_no_private_name_imported_across_modules() -> None:
    found = sorted(u for m in sorted(_modules()) for u in _private_uses(m))
    assert not found, f"{len(found)} private names used across modules:\n" + "\n".join(found)


def test_the_private_name_reader_sees_every_form() -> None:
    src = ("import vgpuvirt.b as mb\nfrom vgpuvirt import c\n"
           "def f():\n    from vgpuvirt.d import _x, y\n    return mb._hidden, c._z, mb.public, y._ok\n")
    found = sorted(re.sub(r":\d+ ", " ", u) for u in _private_uses_in("vgpuvirt.a", ast.parse(src), False,
                                                                        {"vgpuvirt.b", "vgpuvirt.c", "vgpuvirt.d"}))
    assert found == ["vgpuvirt.a imports vgpuvirt.d._x", "vgpuvirt.a uses vgpuvirt.b._hidden",
                     "vgpuvirt.a uses vgpuvirt.c._z"]


# -- classes split across files ------------------------------------------------------------------------------

Trees = Mapping[str, ast.Module]
ClassKey = tuple[str, str]          # (module, class name)


def _all_trees() -> Trees:
    return {m: _tree(m) for m in _modules()}


def _imported_names(module: str, tree: ast.Module) -> dict[str, ClassKey]:
    is_package = module in _modules() and _modules()[module].name == "__init__.py"
    return {a.asname or a.name: (_absolute(module, node, is_package), a.name)
            for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names}


def _base_key(module: str, base: ast.expr, imported: dict[str, ClassKey]) -> ClassKey | None:
    base = base.value if isinstance(base, ast.Subscript) else base
    if isinstance(base, ast.Name):
        return imported.get(base.id, (module, base.id))
    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id in imported:
        return (".".join(imported[base.value.id]), base.attr)
    return None


def split_classes(trees: Trees | None = None) -> list[str]:
    """The classes that are pieces of one class cut across files.

    A class is such a piece when, in vgpuvirt, exactly one class derives from it and that class lives in another
    module, and the piece has no life of its own: it is not an exception (an exception tree is a family, even
    with one member), and nothing creates an instance of it (a mixin, a "calls" base, a tree of attribute
    handlers that only the one subclass assembles). ABCs and Protocols with several implementations are not
    pieces (several subclasses), nor is a class with one subclass that is used on its own (``CliParser``).
    """
    trees = _all_trees() if trees is None else trees
    classes: dict[ClassKey, list[ClassKey | None]] = {}       # each class -> its bases
    subclasses: dict[ClassKey, list[ClassKey]] = {}
    called: set[str] = set()
    for m, tree in trees.items():
        imported = _imported_names(m, tree)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [_base_key(m, b, imported) for b in node.bases]
                classes[(m, node.name)] = bases
                for b in bases:
                    if b is not None:
                        subclasses.setdefault(b, []).append((m, node.name))
        called.update(n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(tree)
                      if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute)))

    def is_exception(key: ClassKey | None) -> bool:
        if key is None:
            return False
        if key not in classes:
            return key[1] in ("Exception", "BaseException") or key[1].endswith(("Error", "Exception"))
        return any(is_exception(b) for b in classes[key])

    found = []
    for key, subs in sorted(subclasses.items()):
        if key not in classes or len(subs) != 1 or subs[0][0] == key[0]:
            continue
        if is_exception(key) or key[1] in called:
            continue
        found.append(f"{key[0]}.{key[1]} is only the base of {subs[0][0]}.{subs[0][1]}")
    return found


def test_no_class_split_across_files() -> None:
    found = split_classes()
    assert not found, f"{len(found)} classes split across files by inheritance:\n" + "\n".join(found)


def test_what_counts_as_a_split_class() -> None:
    trees = {
        "vgpuvirt.a": ast.parse("class Mixin:\n    pass\nclass Used:\n    pass\nclass Oops(ValueError):\n    pass\n"
                                "class Shared:\n    pass\nclass Local:\n    pass\nclass Here(Local):\n    pass\n"),
        "vgpuvirt.b": ast.parse("from vgpuvirt.a import Mixin, Oops, Shared, Used\nimport vgpuvirt.a as A\n"
                                "class Whole(Mixin, Used):\n    pass\nclass Worse(Oops):\n    pass\n"
                                "class One(Shared):\n    pass\nu = Used()\n"),
        "vgpuvirt.c": ast.parse("from vgpuvirt.a import Shared\nclass Two(Shared):\n    pass\n"),
    }
    # Mixin: one subclass elsewhere, never made on its own. Used is instantiated, Oops is an exception, Shared
    # has two subclasses, Local's one subclass is in its own module.
    assert split_classes(trees) == ["vgpuvirt.a.Mixin is only the base of vgpuvirt.b.Whole"]


@pytest.mark.parametrize("module", ["vgpuvirt.host.agent"])
def test_the_agent_stays_one_file(module: str) -> None:
    """The agent is shipped to hosts as one file (python3 >= 3.6, stdlib only): it imports nothing of vgpuvirt."""
    assert not list(_arrows(module)), [a.target for a in _arrows(module)]
