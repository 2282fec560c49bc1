"""The package's layout rules, checked on the source (STYLE.md, "subpackages with one owner
each"): no import cycle between clag_fast modules, no reaching into another object's private
attributes, one errors module whose exceptions are all exported from ``clag_fast``."""

from __future__ import annotations

import ast
from pathlib import Path

import clag_fast
from clag_fast import errors

PKG = Path(clag_fast.__file__).resolve().parent
ROOT = "clag_fast"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()  # a package's __init__ is the package's own node
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


MODULES = modules()
# Native extension modules (``_clag_fast``): leaves of the graph, no Python source to parse.
NATIVE = {module_name(p.with_name(p.name.split(".")[0] + ".py")) for p in PKG.rglob("*.so")} | {
    module_name(p) for p in PKG.rglob("*.pyi")}


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level_imports(tree: ast.Module):
    """Import nodes executed at import time: the module body, and inside module-level
    if/try/with blocks, but not in functions, classes' methods, or ``if TYPE_CHECKING:``."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                stack.extend(node.body)
            stack.extend(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                stack.extend(block)
            for h in node.handlers:
                stack.extend(h.body)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            # A class body runs at import time too; its methods do not (skipped below).
            stack.extend(n for n in node.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def resolve(name: str, module: str, node: ast.ImportFrom | None = None) -> str:
    """Absolute name of an import (relative ``from . import x`` resolved against ``module``)."""
    if node is None or not node.level:
        return name
    base = module.split(".")
    is_pkg = MODULES.get(module, Path()).name == "__init__.py"
    base = base if is_pkg else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([name] if name else []))


def all_imports(tree: ast.Module):
    """Every import node with the function it runs in (None: at import time), skipping only
    ``if TYPE_CHECKING:`` blocks, which never run: imports inside functions and methods count,
    since a call makes them and a circle through them is a circle all the same."""

    def walk(nodes, func):
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, func
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.orelse, func)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(node.body, func or node.name)
            else:
                yield from walk(ast.iter_child_nodes(node), func)

    yield from walk(tree.body, None)


def import_targets(node: ast.Import | ast.ImportFrom, mod: str) -> set[str]:
    """The clag_fast modules an import node loads (the nearest module that exists)."""
    targets: list[str] = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            # `import clag_fast.a.b` imports clag_fast, clag_fast.a and clag_fast.a.b
            targets.append(alias.name)
    else:
        base = resolve(node.module or "", mod, node)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            targets.append(sub if sub in MODULES or sub in NATIVE else base)
    out = set()
    for t in targets:
        if t == ROOT or t.startswith(ROOT + "."):
            # The nearest module that exists (clag_fast._clag_fast is the native one).
            while t not in MODULES and t not in NATIVE and "." in t:
                t = t.rsplit(".", 1)[0]
            if t in MODULES and t != mod:
                out.add(t)
    return out


def import_graph(inside_functions: bool = False) -> dict[str, set[str]]:
    """Module -> the clag_fast modules it imports: at import time only, or (``inside_functions``)
    counting the imports that functions make when called."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, path in MODULES.items():
        tree = parse(path)
        nodes = [n for n, _ in all_imports(tree)] if inside_functions else list(module_level_imports(tree))
        for node in nodes:
            graph[mod] |= import_targets(node, mod)
    return graph


def import_sites() -> list[tuple[str, str | None, str]]:
    """Every (importing module, the function it imports in or None, imported module)."""
    return [(mod, func, target) for mod, path in MODULES.items()
            for node, func in all_imports(parse(path)) for target in import_targets(node, mod)]


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    WHITE, GREY, BLACK = 0, 1, 2
    colour = {m: WHITE for m in graph}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        colour[m] = GREY
        stack.append(m)
        for n in sorted(graph[m]):
            if colour[n] == GREY:
                return stack[stack.index(n):] + [n]
            if colour[n] == WHITE:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        colour[m] = BLACK
        return None

    for m in sorted(graph):
        if colour[m] == WHITE:
            found = visit(m)
            if found:
                return found
    return None


# -- the checker's own checks (so a broken checker cannot pass silently) ---------------------
def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_sees_the_known_edges():
    g = import_graph()
    assert "clag_fast.store.memory_store" in g["clag_fast.store"]
    assert "clag_fast.errors" in g["clag_fast"]
    assert "clag_fast.store.state" in g["clag_fast.store.recovery"]
    # ``from clag_fast.store import organize as org_ops`` names a module: the edge goes to it.
    assert "clag_fast.store.organize" in g["clag_fast.store.slm_scheduler"]
    # Imports inside functions and under TYPE_CHECKING are not edges at import time ...
    assert "clag_fast.slm.server" not in g["clag_fast.slm.connection"]
    assert "clag_fast.embed" not in g["clag_fast"]
    # ... the ones inside functions are once calls count.
    calls = import_graph(inside_functions=True)
    assert "clag_fast.slm.server" in calls["clag_fast.slm.connection"]
    assert "clag_fast.embed.embedder" in calls["clag_fast.store.memory_store"]
    assert g["clag_fast.store.slm_scheduler"] <= calls["clag_fast.store.slm_scheduler"]
    # The native module is a leaf, not an edge back to the package.
    assert "clag_fast" not in g["clag_fast.index"]


def test_module_level_imports_skip_functions_and_type_checking():
    tree = ast.parse(
        "import a\n"
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import b\n"
        "else:\n    import c\n"
        "try:\n    import d\nexcept ImportError:\n    import e\n"
        "def f():\n    import g\n"
        "class K:\n    import h\n    def m(self):\n        import i\n"
    )
    names = {a.name for n in module_level_imports(tree) for a in getattr(n, "names", [])}
    assert names == {"a", "TYPE_CHECKING", "c", "d", "e", "h"}
    # All imports: functions' and methods' too (with where they run), never TYPE_CHECKING's.
    found = {(a.name, func) for n, func in all_imports(tree) for a in n.names}
    assert found == {("a", None), ("TYPE_CHECKING", None), ("c", None), ("d", None), ("e", None),
                     ("g", "f"), ("h", None), ("i", "m")}
    nested = ast.parse("def f():\n    def g():\n        with x:\n            if y:\n                import j\n")
    assert [(a.name, func) for n, func in all_imports(nested) for a in n.names] == [("j", "f")]


# -- the rules --------------------------------------------------------------------------------
def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle between clag_fast modules: " + " -> ".join(cycle)


def test_no_import_cycles_counting_imports_inside_functions():
    """A module that imports another inside a function still depends on it: with those
    imports counted too, the modules still form no circle."""
    cycle = find_cycle(import_graph(inside_functions=True))
    assert cycle is None, "import cycle (imports inside functions counted): " + " -> ".join(cycle)


def _in(module: str, package: str) -> bool:
    return module == f"{ROOT}.{package}" or module.startswith(f"{ROOT}.{package}.")


# The SLM layer and the text-only label work decide from plain inputs; the store applies.
# (importing package, packages it must not import)
FORBIDDEN = [
    ("slm", ("store", "eval")),
    ("labels", ("store", "slm", "eval", "server", "distributed", "integrations", "compat")),
]
# Who may import the evaluation from outside it: the CLI's parser, for the ``eval`` command.
EVAL_IMPORTERS = {("clag_fast.cli", "_parser", "clag_fast.eval.runner")}


def layering_violations(sites) -> list[str]:
    """Imports that break the package rules, from (module, function or None, target) sites."""
    out = []
    for mod, func, target in sites:
        where = f"{mod}{'.' + func + '()' if func else ''} imports {target}"
        for pkg, banned in FORBIDDEN:
            if _in(mod, pkg) and any(_in(target, b) for b in banned):
                out.append(f"{where}: {pkg}/ must not import {', '.join(b + '/' for b in banned)}")
        if _in(target, "eval") and not _in(mod, "eval") and (mod, func, target) not in EVAL_IMPORTERS:
            out.append(f"{where}: only eval/ (and the CLI's eval command) imports eval/")
    return out


def test_the_layering_check_sees_violations():
    bad = [("clag_fast.slm.organizer", "route", "clag_fast.store.state"),
           ("clag_fast.labels.keyphrases", None, "clag_fast.slm.prompts"),
           ("clag_fast.store.memory_store", "label_quality", "clag_fast.eval.labels"),
           ("clag_fast.cli", "cmd_demo", "clag_fast.eval.runner")]
    assert len(layering_violations(bad)) == 4
    good = [("clag_fast.store.slm_scheduler", None, "clag_fast.slm.organizer"),
            ("clag_fast.eval.qa", "run_qa_table", "clag_fast.store.memory_store"),
            ("clag_fast.cli", "_parser", "clag_fast.eval.runner"),
            ("clag_fast.slm.organizer", None, "clag_fast.labels.keyphrases")]
    assert layering_violations(good) == []
    # The scan of the package finds the sites the rules are about.
    sites = import_sites()
    assert ("clag_fast.store.slm_scheduler", "__init__", "clag_fast.slm.triggers") in sites
    assert ("clag_fast.cli", "_parser", "clag_fast.eval.runner") in sites


def test_the_package_layers_hold():
    """slm/ and labels/ import nothing from store/ (labels/ nothing from any layer above it);
    nothing outside eval/ imports eval/ but the CLI's ``eval`` command. Imports inside
    functions count."""
    bad = layering_violations(import_sites())
    assert not bad, "imports across the layers:\n" + "\n".join(bad)


ALLOWED_PRIVATE_OWNERS = {"self", "cls", "np"}


def private_accesses(tree: ast.Module) -> list[tuple[int, str]]:
    """``<name>._<attr>`` where name is not self/cls/np and attr is not a dunder."""
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.attr.startswith("_") and not (node.attr.startswith("__") and node.attr.endswith("__"))
                and node.value.id not in ALLOWED_PRIVATE_OWNERS):
            out.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return out


def test_the_private_access_check_sees_them():
    tree = ast.parse("state._x = 1\nself._y\ncls._z\nnp._w\nstore.__class__\n_foo(1)\nstore._db.close()\n")
    assert private_accesses(tree) == [(1, "state._x"), (7, "store._db")]


def test_no_module_reaches_into_another_objects_private_attributes():
    found = [f"{module_name(p)}:{line}: {text}" for p in sorted(PKG.rglob("*.py"))
             for line, text in private_accesses(parse(p))]
    assert not found, "private attributes used through another object:\n" + "\n".join(found)


def exception_classes() -> dict[str, list[str]]:
    """Public classes deriving (by name, transitively within the package) from an exception."""
    base_names = {"Exception", "BaseException", "ValueError", "OSError", "RuntimeError", "KeyError",
                  "TypeError", "LookupError", "IOError", "EnvironmentError", "ArithmeticError",
                  "AttributeError", "ImportError", "NotImplementedError", "PermissionError",
                  "FileNotFoundError", "TimeoutError", "ConnectionError", "Warning", "UserWarning"}
    found: dict[str, list[str]] = {}
    classes = []
    for p in sorted(PKG.rglob("*.py")):
        for node in ast.walk(parse(p)):
            if isinstance(node, ast.ClassDef):
                bases = [b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                         for b in node.bases]
                classes.append((module_name(p), node.name, bases))
    known = set(base_names)
    changed = True
    while changed:  # subclasses of package exceptions count, through any depth
        changed = False
        for _, name, bases in classes:
            if name not in known and any(b in known for b in bases):
                known.add(name)
                changed = True
    for mod, name, bases in classes:
        if any(b in known for b in bases) and not name.startswith("_"):
            found.setdefault(name, []).append(mod)
    return found


def test_every_public_exception_lives_in_errors():
    classes = exception_classes()
    assert "StoreFormatError" in classes and "LLMTimeout" in classes  # the scan sees them
    elsewhere = {n: m for n, m in classes.items() if m != ["clag_fast.errors"]}
    assert not elsewhere, f"exception classes defined outside clag_fast/errors.py: {elsewhere}"
    assert set(classes) <= set(errors.__all__), "public exceptions missing from errors.__all__"


def test_the_package_exports_every_error():
    missing = set(errors.__all__) - set(clag_fast.__all__)
    assert not missing, f"clag_fast.__all__ lacks {sorted(missing)}"
    for name in errors.__all__:
        assert getattr(clag_fast, name) is getattr(errors, name)



#: Longest function body, in lines (its docstring aside): past this a step can take a name.
MAX_FUNCTION_LINES = 80


def test_no_function_is_longer_than_its_steps_need():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                lines = node.end_lineno - node.lineno + 1 - (len(doc.splitlines()) + 1 if doc else 0)
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert long == []
