"""Mutant generation: which small changes to a module's AST we try, and how one is written back as text.

A mutant is found on the parsed tree and written back by splicing the changed node's text into the
original source (the rest of the file, comments and line numbers included, stays byte for byte), so a
survivor's ``path:line`` points at the line a reader opens. Every mutant can check itself: the spliced
source must parse to exactly the tree we meant (:meth:`Mutant.check`), so a splice that went wrong is
dropped instead of being reported as a survivor.

What is mutated (and why these): the operators of the faults that slip past tests in rule code like
capacity and placement. Comparisons off by one boundary, ``and``/``or`` confused, a negation lost, a
flag inverted, a constant off by one, an Optional/bool result ignored, a side effect (an append, a
``continue``/``break``, a dict entry, a ``raise``) forgotten. Not mutated: docstrings, annotations,
``if TYPE_CHECKING:`` blocks, f-strings (their inner positions are not reliable), logging calls.
"""

from __future__ import annotations

import ast
import copy
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# One step down the tree: (field name, index in that field's list or None for a single node).
Step = tuple[str, "int | None"]

_SWAP_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
}
# A call statement whose only effect is a record or a message: deleting it is not a fault worth a test.
_QUIET_CALL = re.compile(r"^(_?log(ger)?|LOG|_LOG|logging|warnings)\.")
_ANNOTATION_FIELDS = {"annotation", "returns", "type_comment"}


@dataclass(frozen=True)
class Mutant:
    """One change to one module: where, what kind, the text before and after."""

    path: str                 # relative to the repository root, "/" separated
    line: int
    kind: str                 # cmp, boolop, not, bool, int, return, delete, dict
    tree_path: tuple[Step, ...]
    variant: int              # which of a node's mutants (a compare's op index, int +1 / -1, a dict entry)
    start: int                # byte offsets of the replaced text in the UTF-8 source
    end: int
    replacement: str
    original: str             # what the report shows as before and after
    shown: str = ""

    @property
    def ident(self) -> str:
        where = ".".join(f"{f}{'' if i is None else i}" for f, i in self.tree_path)
        return f"{self.path}:{self.line}:{self.kind}:{where}:{self.variant}"

    def apply(self, source: str) -> str:
        raw = source.encode()
        return (raw[:self.start] + self.replacement.encode() + raw[self.end:]).decode()

    def describe(self) -> str:
        return f"{self.path}:{self.line}: {_short(self.original)} -> {_short(self.shown or self.replacement)}"

    def check(self, source: str) -> bool:
        """True when the mutated text parses, compiles, and is the tree we meant (not the original's)."""
        try:
            mutated = ast.parse(self.apply(source))
            compile(mutated, self.path, "exec")
        except SyntaxError:
            return False
        tree = ast.parse(source)
        expected = _mutate_tree(tree, self)
        return ast.dump(mutated) == ast.dump(expected) != ast.dump(ast.parse(source))


def _short(text: str, width: int = 80) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[:width - 3] + "..."


def _line_starts(raw: bytes) -> list[int]:
    starts = [0]
    for i, b in enumerate(raw):
        if b == 0x0A:
            starts.append(i + 1)
    return starts


def _span(node: ast.AST, starts: list[int]) -> tuple[int, int]:
    # ast positions: 1-based lines, UTF-8 byte columns, which is why splicing works on bytes
    start = starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
    end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
    return start, end


# --- what each kind does to a (copied) node --------------------------------------------------------------

def _swap_cmp(node: ast.Compare, i: int) -> ast.AST:
    node.ops[i] = _SWAP_CMP[type(node.ops[i])]()
    return node


def _swap_boolop(node: ast.BoolOp) -> ast.AST:
    node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
    return node


def _drop_not(node: ast.UnaryOp) -> ast.AST:
    return node.operand


def _flip_bool(node: ast.Constant) -> ast.AST:
    return ast.Constant(value=not node.value)


def _shift_int(node: ast.Constant, delta: int) -> ast.AST:
    value = node.value + delta
    # written as text, -1 parses back as a unary minus on 1: build the tree the text will have
    return ast.Constant(value=value) if value >= 0 else ast.UnaryOp(op=ast.USub(), operand=ast.Constant(-value))


def _return_none(node: ast.expr) -> ast.AST:
    return ast.Constant(value=None)


def _return_not(node: ast.expr) -> ast.AST:
    return ast.UnaryOp(op=ast.Not(), operand=node)


def _delete(node: ast.stmt) -> ast.AST:
    return ast.Pass()


def _drop_entry(node: ast.Dict, i: int) -> ast.AST:
    del node.keys[i]
    del node.values[i]
    return node


def _transform(m: Mutant) -> Callable[[ast.AST], ast.AST]:
    kind, v = m.kind, m.variant
    table: dict[str, Callable[[ast.AST], ast.AST]] = {
        "cmp": lambda n: _swap_cmp(n, v),  # type: ignore[arg-type]
        "boolop": _swap_boolop,  # type: ignore[dict-item]
        "not": _drop_not,  # type: ignore[dict-item]
        "bool": _flip_bool,  # type: ignore[dict-item]
        "int": lambda n: _shift_int(n, 1 if v == 0 else -1),  # type: ignore[arg-type]
        "return": _return_none if v == 0 else _return_not,
        "delete": _delete,  # type: ignore[dict-item]
        "dict": lambda n: _drop_entry(n, v),  # type: ignore[arg-type]
    }
    return table[kind]


def _mutate_tree(tree: ast.Module, m: Mutant) -> ast.Module:
    """The tree with mutant ``m`` applied (in place on ``tree``, which is returned)."""
    parent: ast.AST = tree
    for field, index in m.tree_path[:-1]:
        child = getattr(parent, field)
        parent = child if index is None else child[index]
    field, index = m.tree_path[-1]
    if index is None:
        setattr(parent, field, _transform(m)(getattr(parent, field)))
    else:
        lst = getattr(parent, field)
        lst[index] = _transform(m)(lst[index])
    return tree


# --- finding candidates ----------------------------------------------------------------------------------

def _returns_kind(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    if fn.returns is None:
        return ""
    text = ast.unparse(fn.returns).replace(" ", "")
    if text == "bool":
        return "bool"
    if "None" in text.split("|") or text.startswith(("Optional[", "typing.Optional[")):
        return "optional"
    return ""


def _is_type_checking(node: ast.If) -> bool:
    return ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _is_main_guard(node: ast.If) -> bool:
    return ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _deletable(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Continue, ast.Break, ast.Raise)):
        return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        return not _QUIET_CALL.match(ast.unparse(node.value.func))
    return False


def mutants_of(source: str, path: str) -> list[Mutant]:
    """Every mutant of one module's source, in source order. ``path`` is only recorded, never read."""
    tree = ast.parse(source)
    raw = source.encode()
    starts = _line_starts(raw)
    found: list[Mutant] = []

    def add(node: ast.AST, trail: tuple[Step, ...], kind: str, variant: int, target: ast.AST | None = None,
            replaced: ast.AST | None = None) -> None:
        # target: the node whose text is replaced (the node itself unless a return's value)
        target = target or node
        start, end = _span(target, starts)
        new = _transform(Mutant(path, 0, kind, trail, variant, 0, 0, "", ""))(copy.deepcopy(node))
        # an expression goes back in parentheses, so it binds as one wherever it sits
        text = ast.unparse(new) if isinstance(new, ast.stmt) else f"({ast.unparse(new)})"
        before, shown = raw[start:end].decode(), ""
        if kind == "dict":
            # the report names the entry that went, not the whole (possibly long) literal
            d: ast.Dict = node  # type: ignore[assignment]
            key, value = d.keys[variant], d.values[variant]
            assert key is not None
            before = raw[_span(key, starts)[0]:_span(value, starts)[1]].decode()
            shown = "(entry removed)"
        elif kind == "delete":
            shown = "(statement removed)"
        found.append(Mutant(path, node.lineno, kind, trail, variant, start, end,  # type: ignore[attr-defined]
                            text, before, shown))

    def visit(node: ast.AST, trail: tuple[Step, ...], returns: str) -> None:
        if isinstance(node, ast.JoinedStr):
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            returns = _returns_kind(node)
        elif isinstance(node, ast.Lambda):
            returns = ""
        if isinstance(node, ast.If) and (_is_type_checking(node) or _is_main_guard(node)):
            return
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _SWAP_CMP:
                    add(node, trail, "cmp", i)
        elif isinstance(node, ast.BoolOp):
            add(node, trail, "boolop", 0)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            add(node, trail, "not", 0)
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            add(node, trail, "bool", 0)
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            add(node, trail, "int", 0)
            add(node, trail, "int", 1)
        elif isinstance(node, ast.Dict):
            for i, key in enumerate(node.keys):
                if key is not None:          # a ``**other`` entry is a merge, not an entry
                    add(node, trail, "dict", i)
        elif isinstance(node, ast.Return) and node.value is not None and returns:
            is_const = isinstance(node.value, ast.Constant)
            is_none = is_const and node.value.value is None  # type: ignore[attr-defined]
            if returns == "optional" and not is_none:
                add(node.value, (*trail, ("value", None)), "return", 0)
            elif returns == "bool" and not (is_const and isinstance(node.value.value, bool)):  # type: ignore[attr-defined]
                # a literal True/False is already flipped by the "bool" kind
                add(node.value, (*trail, ("value", None)), "return", 1)
        for field, value in ast.iter_fields(node):
            if field in _ANNOTATION_FIELDS:
                continue
            if isinstance(value, list):
                for i, child in enumerate(value):
                    if not isinstance(child, ast.AST):
                        continue
                    if isinstance(child, ast.stmt) and not _is_docstring(child) and _deletable(child):
                        add(child, (*trail, (field, i)), "delete", 0)
                    if isinstance(child, ast.stmt) and _is_docstring(child):
                        continue
                    visit(child, (*trail, (field, i)), returns)
            elif isinstance(value, ast.AST):
                visit(value, (*trail, (field, None)), returns)

    visit(tree, (), "")
    found.sort(key=lambda m: (m.line, m.start, m.kind, m.variant))
    return found


def iter_valid(source: str, mutants: list[Mutant]) -> Iterator[Mutant]:
    """The mutants whose text is the tree they claim to be (see :meth:`Mutant.check`)."""
    return (m for m in mutants if m.check(source))
