"""The package layout keeps its rules (docs/architecture.md, "Layers"): no import cycle, the
evaluation layer imports nothing run-level, the math layer nothing above it, and no function is
longer than 80 lines. The import graph counts function-level imports too, and imports by name
(`importlib.import_module("gedl_jax...")`, `__import__`), e.g. in a module `__getattr__`.
Outside methods/, nothing spells a method's name or checks a method's class: the tables that
name methods aside, code asks the method itself."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "gedl_jax"

# layer -> package prefixes it must not import (each layer may import only what is below it).
FORBIDDEN = {
    "gedl_jax.evidential": ("gedl_jax.evaluation", "gedl_jax.networks", "gedl_jax.methods",
                            "gedl_jax.data", "gedl_jax.run", "gedl_jax.config",
                            "gedl_jax.train", "gedl_jax.evaluate"),
    "gedl_jax.evaluation": ("gedl_jax.networks", "gedl_jax.methods", "gedl_jax.run",
                            "gedl_jax.train", "gedl_jax.evaluate", "gedl_jax.data"),
    "gedl_jax.networks": ("gedl_jax.methods", "gedl_jax.run", "gedl_jax.train",
                          "gedl_jax.evaluate", "gedl_jax.data"),
    "gedl_jax.methods": ("gedl_jax.run", "gedl_jax.train", "gedl_jax.evaluate"),
    "gedl_jax.data": ("gedl_jax.methods", "gedl_jax.run", "gedl_jax.train",
                      "gedl_jax.evaluate", "gedl_jax.networks"),
    # the config package imports nothing above the data registry and the evidential math
    "gedl_jax.config": ("gedl_jax.methods", "gedl_jax.run", "gedl_jax.train",
                        "gedl_jax.evaluate", "gedl_jax.networks", "gedl_jax.data",
                        "gedl_jax.evaluation", "gedl_jax.configs", "gedl_jax.pretrained",
                        "gedl_jax.configuration", "gedl_jax.cli", "gedl_jax.notebook"),
    "gedl_jax.run": ("gedl_jax.train", "gedl_jax.evaluate", "gedl_jax.pretrained"),
    "gedl_jax.pretrained": ("gedl_jax.train", "gedl_jax.evaluate"),
}
# The arrows FORBIDDEN would refuse that are allowed: the dataset facts (K, validation fraction,
# OOD sets, near / far groups) are read from the registry, a table that imports nothing of
# gedl_jax but its error type (test_the_registry_is_a_leaf).
ALLOWED_EXCEPTIONS = {"gedl_jax.config": ("gedl_jax.data.registry",),
                      "gedl_jax.evaluation.any_model": ("gedl_jax.data.registry",),
                      "gedl_jax.evaluation.sections": ("gedl_jax.data.registry",)}
# Modules that import a module whose name is computed (not a string literal), and why: the
# checker cannot see where such an arrow points, so no other module may have one.
COMPUTED_IMPORTS = {
    "gedl_jax": "old names of moved modules, read from their new places (_MOVED)",
    "gedl_jax.networks.user": "a user's network class by its module name",
}
_IMPORT_FUNCTIONS = ("import_module", "__import__")
MAX_FUNCTION_LINES = 80


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p))
            for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Every gedl_jax module `name` imports, at any depth of the file."""
    found = set()
    package = name if any(k.startswith(name + ".") for k in known) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("gedl_jax")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([node.module] if node.module else []))
            if not base.startswith("gedl_jax"):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
        elif _imported_by_name(node) is not None:
            target = _imported_by_name(node)
            while target not in known and "." in target:   # a name inside a module
                target = target.rpartition(".")[0]
            found.add(target)
    return {m for m in found if m in known and m != name}


def _imported_by_name(node: ast.AST) -> str | None:
    """The gedl_jax module a call `importlib.import_module("gedl_jax...")` or
    `__import__("gedl_jax...")` imports by its literal name, else None."""
    if not (isinstance(node, ast.Call) and node.args and _import_function(node.func)):
        return None
    arg = node.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and (
            arg.value == "gedl_jax" or arg.value.startswith("gedl_jax.")):
        return arg.value
    return None


def _import_function(func: ast.AST) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in _IMPORT_FUNCTIONS


def _computed_imports(tree: ast.Module) -> list[int]:
    """Lines of import calls whose module name is not a string literal."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and node.args and _import_function(node.func)
            and not (isinstance(node.args[0], ast.Constant)
                     and isinstance(node.args[0].value, str))]


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, tree, set(modules)) for name, tree in modules.items()}


def test_no_import_cycle(graph):
    # The package __init__ maps old module names to their new places (one release), lazily:
    # its edges are not real dependencies.
    edges = {m: {d for d in deps if d != "gedl_jax"} for m, deps in graph.items()
             if m != "gedl_jax"}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycle = stack[stack.index(d):] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m)


def test_layers_import_only_what_is_below_them(graph):
    bad = []
    for module, deps in graph.items():
        for layer, forbidden in FORBIDDEN.items():
            if module == layer or module.startswith(layer + "."):
                allowed = ALLOWED_EXCEPTIONS.get(module, ALLOWED_EXCEPTIONS.get(layer, ()))
                bad += [f"{module} imports {d}" for d in sorted(deps)
                        if any(d == f or d.startswith(f + ".") for f in forbidden)
                        and d not in allowed]
    assert not bad, "\n".join(bad)


def test_the_registry_is_a_leaf(graph):
    """What the config package may read from data/ imports nothing of gedl_jax but
    data.errors."""
    assert graph["gedl_jax.data.registry"] <= {"gedl_jax.data.errors"}
    assert graph["gedl_jax.data.errors"] == set()


def test_no_function_longer_than_80_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} "
                                f"{node.name} ({length} lines)")
    assert not long, "\n".join(long)


def test_the_graph_sees_function_level_imports(graph):
    """A mutation check of the checker itself: run/workdir.py imports metrics inside a
    function."""
    assert "gedl_jax.evaluation.metrics" in graph["gedl_jax.run.workdir"]


def test_the_graph_sees_imports_by_name():
    """A mutation check of the checker: a module `__getattr__` that loads the run layer by name
    is an arrow, as a plain import would be."""
    source = ("import importlib\n"
              "def __getattr__(name):\n"
              "    return getattr(importlib.import_module('gedl_jax.run.inference'), name)\n"
              "def other():\n"
              "    return __import__('gedl_jax.run.steps.make_predict_step')\n")
    known = {"gedl_jax.run.inference", "gedl_jax.run.steps", "gedl_jax.evaluation"}
    assert _imports("gedl_jax.evaluation", ast.parse(source), known) == {
        "gedl_jax.run.inference", "gedl_jax.run.steps"}


def test_no_import_by_computed_name_outside_the_known_places():
    found = {name: _computed_imports(tree) for name, tree in _modules().items()}
    unexpected = {name: lines for name, lines in found.items()
                  if lines and name not in COMPUTED_IMPORTS}
    assert not unexpected, f"imports by a computed module name (add to COMPUTED_IMPORTS with " \
                           f"the reason, if the target is not gedl_jax's): {unexpected}"
    assert all(found.get(name) for name in COMPUTED_IMPORTS), "a stale COMPUTED_IMPORTS entry"


# --------------------------------------------------------------- methods answer for themselves
# Where a method's name may stand outside gedl_jax/methods/: the tables that name methods (the
# presets, the default method and the ensemble's member preset: config/presets.py and
# config/fields.py; the old flat settings' owners: config/legacy.py) and the old module names
# of gedl_jax/__init__.py.
# bin/reproduce.py lists the methods it runs. Everything else asks the method (its class
# attributes: reads_features, output_width, calibrator, score_captions, ...).
NAME_TABLES = {"config/presets.py": {"VARIANTS", "ENSEMBLE_PRESET"},
               "config/fields.py": {"DEFAULT_METHOD"},
               "config/legacy.py": {"LEGACY_METHOD_FIELDS"},
               "__init__.py": {"_MOVED"},
               # the paper's tables, a row per method as the paper prints them
               "paper.py": {"PAPER", "PAPER_STD", "CALIBRATION", "CALIBRATION_STD",
                            "MAIN_METHODS"}}
BIN = PACKAGE.parent / "bin"


def _method_names_and_types() -> tuple[set[str], set[str]]:
    import inspect

    from gedl_jax import methods

    types = {name for module in (methods.base, methods.evidential, methods.softmax,
                                 methods.duq, methods.prior_networks, methods.postnet,
                                 methods.daedl, methods.fedl)
             for name, obj in vars(module).items()
             if inspect.isclass(obj) and issubclass(obj, methods.Method)
             and obj is not methods.Method}
    return set(methods.METHODS), types


def _table_nodes(tree: ast.Module, tables: set[str]) -> set[int]:
    """The ids of every node inside a top-level statement that builds one of `tables`."""
    inside = set()
    for stmt in tree.body:
        targets = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)
                   and isinstance(n.ctx, ast.Store)} if isinstance(
            stmt, (ast.Assign, ast.AnnAssign)) else set()
        call = (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                and isinstance(stmt.value.func, ast.Attribute)
                and isinstance(stmt.value.func.value, ast.Name)
                and stmt.value.func.value.id in tables)
        if targets & tables or call or (isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name)
                and t.value.id in tables for t in stmt.targets)):
            inside |= {id(n) for n in ast.walk(stmt)}
    return inside


def method_name_checks(path: pathlib.Path, names: set[str], types: set[str],
                       tables: set[str] = frozenset()) -> list[str]:
    """Every place in `path` that spells a method's name as a string or names a method class."""
    tree = ast.parse(path.read_text())
    allowed = _table_nodes(tree, set(tables))
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        if isinstance(node, ast.Constant) and node.value in names:
            found.append(f"{path.name}:{node.lineno} the method name {node.value!r}")
        named = (node.id if isinstance(node, ast.Name) else node.attr
                 if isinstance(node, ast.Attribute) else None)
        if isinstance(node, ast.ImportFrom):
            found += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names
                      if a.name in types]
        elif named in types:
            found.append(f"{path.name}:{node.lineno} the method class {named}")
    return found


def test_no_method_name_or_method_type_check_outside_methods():
    names, types = _method_names_and_types()
    assert {"duq", "evidential"} <= names and {"Evidential", "PostNet", "KLPriorNetwork"} <= types
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if "methods" not in
             p.relative_to(PACKAGE).parts] + [p for p in sorted(BIN.glob("*.py"))
                                              if p.name != "reproduce.py"]
    found = []
    for path in files:
        tables = NAME_TABLES.get(str(path.relative_to(PACKAGE)), set()) \
            if path.is_relative_to(PACKAGE) else set()
        found += [f"{path.relative_to(PACKAGE.parent).parent}/{f}"
                  for f in method_name_checks(path, names, types, tables)]
    assert not found, "\n".join(found)


def test_the_method_name_check_finds_a_name_a_type_and_an_import(tmp_path):
    """A mutation check of the checker: what run/workdir.py and methods/common.py did."""
    probe = tmp_path / "probe.py"
    probe.write_text("from gedl_jax.methods.evidential import Evidential\n"
                     "VARIANTS = {'duq': 1}\n"
                     "evidential = isinstance(method, Evidential)\n"
                     "FEATURE_METHODS = ('duq', 'daedl')\n"
                     "wide = config.method == 'postnet'\n")
    found = method_name_checks(probe, *_method_names_and_types(), tables={"VARIANTS"})
    assert found == ["probe.py:1 imports Evidential", "probe.py:3 the method class Evidential",
                     "probe.py:4 the method name 'duq'", "probe.py:4 the method name 'daedl'",
                     "probe.py:5 the method name 'postnet'"]
