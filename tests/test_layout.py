"""The package layout keeps its rules (docs/architecture.md, "Layers"): every layer stands on a
floor of tools/architecture.py's table and imports only from the floors below its own (so no
import cycle, and no library module imports the command layer), the package stands on at most
`MAX_FLOORS` floors, the document draws that table, and no function is longer than 80 lines.
The import graph counts function-level imports too, and imports by name
(`importlib.import_module("gedl_jax...")`, `__import__`), e.g. in a module `__getattr__`, and an
old module name (`gedl_jax._MOVED`) as the module it moved to. A module's
`if __name__ == "__main__":` block is a program, not part of what importing the module runs:
it is not in the graph, and it may only forward to its command (`python -m gedl_jax.train`).
Outside methods/, nothing spells a method's name or checks a method's class: the tables that
name methods aside, code asks the method itself."""

from __future__ import annotations

import ast
import pathlib

import pytest

import gedl_jax
from tools import architecture
from tools.architecture import FLOORS, MAX_FLOORS, layer_of

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "gedl_jax"
COMMANDS = "gedl_jax.commands"
# Old module names, each read as the module it moved to (gedl_jax.cli is gedl_jax.commands.cli).
ALIASES = dict(gedl_jax._MOVED)
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


def _is_program_block(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":` at the top level of a module."""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")


def _program_blocks(tree: ast.Module) -> list[ast.If]:
    return [node for node in tree.body if _is_program_block(node)]


def _library_part(tree: ast.Module) -> ast.Module:
    """The module as importing it runs it: without its program blocks."""
    return ast.Module([node for node in tree.body if not _is_program_block(node)], [])


def _imports(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """Every gedl_jax module `name` imports, at any depth of the file (an old name as the module
    it moved to)."""
    found = set()
    known = known | set(ALIASES)
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
    found = {ALIASES.get(m, m) for m in found}
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


def import_graph(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """module -> the gedl_jax modules importing it imports (its program blocks left out)."""
    return {name: _imports(name, _library_part(tree), set(modules))
            for name, tree in modules.items()}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(_modules())


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


def floor_violations(graph: dict[str, set[str]]) -> list[str]:
    """Every import from one layer to another that does not go down to a lower floor."""
    bad = []
    for module, deps in sorted(graph.items()):
        here = layer_of(module)
        for dep in sorted(deps):
            there = layer_of(dep)
            if here is None or there is None or here[1] == there[1]:
                continue
            if there[0] >= here[0]:
                bad.append(f"{module} (floor {here[0]}, {here[1].label}) imports {dep} "
                           f"(floor {there[0]}, {there[1].label})")
    return bad


def command_layer_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every library module (outside gedl_jax.commands) that imports the command layer."""
    return [f"{module} imports {dep}" for module, deps in sorted(graph.items())
            if not (module == COMMANDS or module.startswith(COMMANDS + "."))
            for dep in sorted(deps) if dep == COMMANDS or dep.startswith(COMMANDS + ".")]


def longest_chain(graph: dict[str, set[str]]) -> int:
    """The floors the package stands on: the most layers a chain of imports between layers
    passes through (a layer that imports no other layer stands on floor 1)."""
    edges: dict[str, set[str]] = {}
    for module, deps in graph.items():
        here = layer_of(module)
        if here is None:
            continue
        edges.setdefault(here[1].label, set()).update(
            layer_of(d)[1].label for d in deps
            if layer_of(d) is not None and layer_of(d)[1] != here[1])
    height: dict[str, int] = {}

    def climb(label: str, seen: tuple[str, ...] = ()) -> int:
        assert label not in seen, f"a cycle between layers: {' -> '.join(seen + (label,))}"
        if label not in height:
            height[label] = 1 + max((climb(d, seen + (label,)) for d in edges.get(label, ())),
                                    default=0)
        return height[label]

    return max(climb(label) for label in edges)


def test_every_module_stands_on_a_floor(graph):
    homeless = [m for m in sorted(graph) if m != "gedl_jax" and layer_of(m) is None]
    assert not homeless, f"modules on no floor (give them a layer in tools/architecture.py): " \
                         f"{homeless}"


def test_layers_import_only_from_the_floors_below(graph):
    bad = floor_violations(graph)
    assert not bad, "\n".join(bad)


def test_no_library_module_imports_the_command_layer(graph):
    bad = command_layer_imports(graph)
    assert not bad, "\n".join(bad)
    assert layer_of(COMMANDS)[0] == len(FLOORS), "the command layer is the top floor"


def test_the_package_stands_on_at_most_max_floors(graph):
    """The drawing's floors are the real ones: the longest chain of imports between layers
    climbs every floor of the table, and there are at most MAX_FLOORS of them."""
    assert longest_chain(graph) == len(FLOORS) <= MAX_FLOORS


def test_a_planted_import_of_the_command_layer_is_found():
    """A mutation check of the checker: a library module that imports the command layer, by
    its name, by the old name gedl_jax.cli, or inside a function, is found (and climbs above
    it); the same import in the module's program block is not an arrow."""
    modules = _modules()
    planted = {
        "from gedl_jax.commands import cli\n": "gedl_jax.commands.cli",
        "from gedl_jax import cli\n": "gedl_jax.commands.cli",
        "def main():\n    import gedl_jax.commands.fetch\n": "gedl_jax.commands.fetch",
    }
    for source, target in planted.items():
        graph = import_graph({**modules, "gedl_jax.data.fetch": ast.parse(source)})
        assert command_layer_imports(graph) == [f"gedl_jax.data.fetch imports {target}"]
        assert any(v.startswith("gedl_jax.data.fetch (floor 2") for v in floor_violations(graph))
    program = ast.parse('import sys\nif __name__ == "__main__":\n'
                        '    from gedl_jax.commands import fetch as command\n'
                        '    sys.exit(command.main())\n')
    graph = import_graph({**modules, "gedl_jax.data.fetch": program})
    assert command_layer_imports(graph) == [] and not _not_forwards(program)


def test_a_planted_floor_too_many_is_found():
    """A mutation check: a chain through one more layer (the config package reading the run
    engine) makes the package a floor taller, and the arrow is refused."""
    graph = import_graph({**_modules(), "gedl_jax.config.presets": ast.parse(
        "from gedl_jax.run import workdir\n")})
    assert any(v.startswith("gedl_jax.config.presets (floor 2") for v in floor_violations(graph))
    with pytest.raises(AssertionError, match="a cycle between layers"):
        longest_chain(graph)


def _not_forwards(tree: ast.Module) -> list[str]:
    """The statements of `tree`'s program blocks that are not a forward to a command: an
    import from gedl_jax.commands (or of run.startup_signals, which a command installs before
    its imports), `startup_signals.install()` or `sys.exit(<command>.main())`."""
    bad = []
    for block in _program_blocks(tree):
        for stmt in block.body + block.orelse:
            if isinstance(stmt, ast.ImportFrom) and stmt.module in (
                    COMMANDS, "gedl_jax.run") and all(
                    stmt.module == COMMANDS or a.name == "startup_signals" for a in stmt.names):
                continue
            call = stmt.value if isinstance(stmt, ast.Expr) else None
            text = ast.unparse(call) if isinstance(call, ast.Call) else ""
            if text == "startup_signals.install()" or (
                    text.startswith("sys.exit(") and text.endswith(".main())")):
                continue
            bad.append(f"line {stmt.lineno}: {ast.unparse(stmt)}")
    return bad


def test_program_blocks_only_forward_to_their_command():
    """`python -m gedl_jax.train` and the other documented names run a library module as a
    program: its `if __name__ == "__main__":` block forwards to the command and does nothing
    else (the command's flags, help and errors are in gedl_jax/commands/)."""
    modules = _modules()
    bad = {name: _not_forwards(tree) for name, tree in modules.items()
           if not (name == COMMANDS or name.startswith(COMMANDS + "."))}
    assert not {name: lines for name, lines in bad.items() if lines}
    forwarding = {name for name, tree in modules.items() if _program_blocks(tree)
                  and not name.startswith(COMMANDS)}
    assert {"gedl_jax.train", "gedl_jax.evaluate", "gedl_jax.data.fetch",
            "gedl_jax.data.regenerate", "gedl_jax.pretrained.__main__"} <= forwarding


def test_a_planted_program_block_with_its_own_work_is_found():
    """A mutation check: a program block that parses flags or trains itself is refused."""
    tree = ast.parse('import sys\nif __name__ == "__main__":\n'
                     '    from gedl_jax.run import training\n'
                     '    print(sys.argv)\n'
                     '    sys.exit(training.run(None, "w"))\n')
    assert _not_forwards(tree) == ["line 3: from gedl_jax.run import training",
                                   "line 4: print(sys.argv)",
                                   "line 5: sys.exit(training.run(None, 'w'))"]


def test_the_registry_is_a_leaf(graph):
    """What the config package may read from data/ imports nothing of gedl_jax but
    data.errors."""
    assert graph["gedl_jax.data.registry"] <= {"gedl_jax.data.errors"}
    assert graph["gedl_jax.data.errors"] == set()


def test_the_document_draws_the_table():
    """docs/architecture.md's "Layers" section is tools/architecture.py's drawing of FLOORS
    (`python -m tools.architecture` writes it); a changed drawing is seen."""
    current = architecture.DOCUMENT.read_text()
    assert architecture.document(current) == current, "run: python -m tools.architecture"
    changed = current.replace("floor  layer", "floor  layer (edited by hand)")
    assert architecture.document(changed) != changed
    assert architecture.main(["--check"]) == 0


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
# bin/reproduce.py lists the methods it runs. Everything else (tools/ too) asks the method (its
# class attributes: reads_features, output_width, calibrator, score_captions, ...).
NAME_TABLES = {"config/presets.py": {"VARIANTS", "ENSEMBLE_PRESET"},
               "config/fields.py": {"DEFAULT_METHOD"},
               "config/legacy.py": {"LEGACY_METHOD_FIELDS"},
               "__init__.py": {"_MOVED"},
               # the paper's tables, a row per method as the paper prints them
               "paper.py": {"PAPER", "PAPER_STD", "CALIBRATION", "CALIBRATION_STD",
                            "MAIN_METHODS"}}
BIN = PACKAGE.parent / "bin"
TOOLS = PACKAGE.parent / "tools"


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
                                              if p.name != "reproduce.py"] + sorted(
        TOOLS.glob("*.py"))
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


def test_nothing_imports_the_old_configuration_module(graph):
    """gedl_jax.configuration is the old name of gedl_jax.config, kept for users for one release;
    the package itself reads the new one."""
    assert [m for m, deps in sorted(graph.items()) if "gedl_jax.configuration" in deps] == []
