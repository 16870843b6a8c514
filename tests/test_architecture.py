"""The shape of the house, read from the source: no import circles (imports inside functions and package
`__init__`s count), one checkpoint reader, short functions and files."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: folder → the package it installs as (pyproject's package-dir): the catalog and the recipes count too
PACKAGE = ROOT / "framework"
FOLDERS = {"framework": "framework", "registry": "framework.catalog", "recipes": "framework.recipes"}


def module_name(path: Path) -> str:
    folder, *parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join([FOLDERS[folder], *parts])


def modules() -> dict[str, Path]:
    return {module_name(p): p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))}


def _targets(node: ast.AST, here: str, is_package: bool, known: set[str]) -> list[str]:
    """The framework modules one import statement runs: the module named, each package above it (their
    `__init__`s run first), and for `from P import name` the submodule P.name where there is one."""
    if isinstance(node, ast.Import):
        named = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: resolve against this module's package
            package = here if is_package else here.rpartition(".")[0]
            for _ in range(node.level - 1):
                package = package.rpartition(".")[0]
            base = f"{package}.{base}".rstrip(".")
        named = [base, *(f"{base}.{alias.name}" for alias in node.names)]
    found = set()
    for name in named:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in known and prefix != "framework":
                found.add(prefix)
    return sorted(found)


def _dynamic_target(node: ast.Call) -> str | None:
    """The module an `importlib.import_module("a.b")` call names, when it is a literal."""
    func = node.func
    named = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if named == "import_module" and node.args and isinstance(node.args[0], ast.Constant):
        return str(node.args[0].value)
    return None


def import_graph() -> dict[str, set[str]]:
    """module → the framework modules importing it runs, at any depth of its code (functions included). A
    module's own packages are left out: Python has them half-initialised already when it runs."""
    mods = modules()
    known = set(mods)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(_targets(node, name, path.name == "__init__.py", known))
            elif isinstance(node, ast.Call) and (target := _dynamic_target(node)):
                edges.update(_targets(ast.Import(names=[ast.alias(target)]), name, False, known))
        graph[name] = edges - own - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_framework_module_imports_one_that_imports_it_back():
    assert cycles(import_graph()) == []


def test_the_catalog_and_the_recipes_import_every_module_of_their_folders():
    """`load_catalog` imports the two packages (entry points); their `__init__`s must name every module."""
    graph = import_graph()
    for package, folder in (("framework.catalog", "registry"), ("framework.recipes", "recipes")):
        files = {f"{package}.{p.stem}" for p in (ROOT / folder).glob("*.py") if p.stem != "__init__"}
        assert files <= graph[package], sorted(files - graph[package])


def test_the_graph_reader_sees_imports_inside_functions_and_package_inits():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    tree = ast.parse("def f():\n    from framework.hub.common import X\n")
    node = tree.body[0].body[0]
    assert _targets(node, "framework.rundir", False, {"framework.hub", "framework.hub.common"}) == [
        "framework.hub", "framework.hub.common"]
    call = ast.parse("importlib.import_module('framework.catalog')").body[0].value
    assert _dynamic_target(call) == "framework.catalog"


MAX_FUNCTION_LINES, MAX_FILE_LINES = 60, 350


def long_functions(limit: int = MAX_FUNCTION_LINES) -> list[tuple[int, str]]:
    """(lines, 'module:function') of every function in framework/ longer than `limit` lines (docstring included)."""
    found = []
    for name, path in modules().items():
        if not name.startswith("framework.") or name.startswith(("framework.catalog", "framework.recipes")):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((lines, f"{name}:{node.name}"))
    return sorted(found, reverse=True)


def long_files(limit: int = MAX_FILE_LINES) -> list[tuple[int, str]]:
    return sorted(((n, str(p.relative_to(ROOT))) for p in PACKAGE.rglob("*.py")
                   if (n := len(p.read_text().splitlines())) > limit), reverse=True)


def test_no_function_in_framework_is_longer_than_60_lines():
    assert long_functions() == []


def test_no_file_in_framework_is_longer_than_350_lines():
    assert long_files() == []


def _framework_trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in modules().items()
            if name.startswith("framework.") and not name.startswith(("framework.catalog", "framework.recipes"))}


def _main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":` — where a module hands its main's code to the interpreter."""
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and isinstance(test, ast.Compare) and getattr(test.left, "id", "") == "__name__"


def test_nothing_below_the_edge_raises_system_exit_or_prints_its_own_error_line():
    """Exits happen in `framework.errors` (the mapping) and in `__main__` guards only; `error:` lines are printed
    by `framework.errors` alone."""
    found = []
    for name, tree in _framework_trees().items():
        if name == "framework.errors":
            continue
        guarded = {id(n) for g in ast.walk(tree) if _main_guard(g) for n in ast.walk(g)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and "SystemExit" in ast.unparse(node) and id(node) not in guarded \
                    and not name.endswith("__main__"):
                found.append(f"{name}:{node.lineno} raises SystemExit")
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("error: "):
                found.append(f"{name}:{node.lineno} prints its own error line")
    assert found == []


def test_no_broad_except_swallows_what_it_caught():
    """An `except Exception` (or bare/BaseException) must re-raise or turn the error into another; never only
    return, pass or continue."""
    found = []
    for name, tree in _framework_trees().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and (node.type is None or ast.unparse(node.type) in (
                    "Exception", "BaseException")):
                if all(isinstance(s, (ast.Return, ast.Pass, ast.Continue)) for s in node.body):
                    found.append(f"{name}:{node.lineno}")
    assert found == []
