"""Which test files cover a module: those that import it, directly or through the modules importing it.

Read from the source alone (no test is imported, nothing runs), every import at every level counts:
function-level imports, ``from pkg import submodule``, bare imports of test helpers (``provision_fixtures``,
found next to the importing file or at the top of a test folder), and dotted module names written as
strings (the CLI's lazy verb table names its verb modules that way, and a CLI test reaches them through it).

A test file's distance to a module is the number of modules between them on the shortest import chain
(0: the test imports it itself). The runner runs the closest files first and stops at the first failure,
so a killed mutant usually costs one file, and a survivor costs the whole selection.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache",
              ".hypothesis", "build", "dist", "node_modules"}


@dataclass(frozen=True)
class Selection:
    module: str               # dotted name of the mutated module
    tests: tuple[str, ...]    # test files, relative to the root, closest first
    distance: dict[str, int]


def _py_files(root: Path, under: Path) -> list[Path]:
    return sorted(p for p in under.rglob("*.py") if not (set(p.relative_to(root).parts) & _SKIP_DIRS))


def module_name(root: Path, path: Path) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


class ImportGraph:
    """Who imports whom, among the source modules under ``root`` and the files of the test folders."""

    def __init__(self, root: Path, test_dirs: list[Path]) -> None:
        self.root = root
        self.test_dirs = test_dirs
        test_roots = {d.resolve() for d in test_dirs} | {(root / "tests").resolve()}
        self.sources: dict[str, Path] = {}
        for p in _py_files(root, root):
            if not any(p.resolve().is_relative_to(t) for t in test_roots):
                self.sources[module_name(root, p)] = p
        self.tests: list[Path] = []
        for d in test_dirs:
            self.tests.extend(p for p in _py_files(root, d) if p.name.startswith("test_"))
        # node -> the nodes it imports; a node is a dotted source module or a test-side file path
        self.edges: dict[str, set[str]] = {}
        for name, p in self.sources.items():
            self.edges[name] = self._imports_of(p, name)
        self.helpers: dict[str, Path] = {}
        pending = list(self.tests)
        while pending:
            p = pending.pop()
            key = self._key(p)
            if key in self.edges:
                continue
            self.edges[key] = self._imports_of(p, None)
            for target in self.edges[key]:
                if target.endswith(".py") and target not in self.edges:
                    pending.append(root / target)

    def _key(self, p: Path) -> str:
        return p.relative_to(self.root).as_posix()

    def _resolve(self, name: str, importer: Path) -> str | None:
        if name in self.sources:
            return name
        head = name.split(".")[0]
        # a bare import from a test file: a helper next to it, or at the top of a test folder
        for folder in (importer.parent, *self.test_dirs, self.root / "tests"):
            cand = folder / f"{head}.py"
            if cand.is_file():
                return self._key(cand)
        return None

    def _imports_of(self, p: Path, own: str | None) -> set[str]:
        try:
            tree = ast.parse(p.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            return set()
        names: set[str] = set()
        package = (own if p.name == "__init__.py" else own.rpartition(".")[0]) if own else ""
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".") if package else []
                    parts = parts[:len(parts) - (node.level - 1)] if node.level > 1 else parts
                    base = ".".join([*parts, base] if base else parts)
                if base:
                    names.add(base)
                names.update(f"{base}.{a.name}" if base else a.name for a in node.names)
            elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.match(node.value)
                  and node.value in self.sources):
                names.add(node.value)
        found: set[str] = set()
        for name in names:
            # importing a.b.c runs a/__init__ and a/b/__init__ too
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in self.sources:
                    found.add(prefix)
            target = self._resolve(name, p)
            if target is not None:
                found.add(target)
        found.discard(own or "")
        return found

    def select(self, module: str, depth: int) -> Selection:
        """Test files within ``depth`` modules of ``module`` on an import chain, closest first."""
        importers: dict[str, set[str]] = {}
        for src, targets in self.edges.items():
            for t in targets:
                importers.setdefault(t, set()).add(src)
        dist = {module: -1}
        queue = deque([module])
        while queue:
            cur = queue.popleft()
            for imp in sorted(importers.get(cur, ())):
                if imp not in dist:
                    dist[imp] = dist[cur] + 1
                    if dist[imp] < depth:
                        queue.append(imp)
        test_keys = {self._key(t) for t in self.tests}
        chosen = {k: d for k, d in dist.items() if k in test_keys and d <= depth}
        ordered = tuple(sorted(chosen, key=lambda k: (chosen[k], k)))
        return Selection(module, ordered, chosen)
