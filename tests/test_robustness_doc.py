"""docs/robustness.md: every row of its tables names the tests that run it, as `module::test`
node ids of files under tests/, and each of those tests exists. A new row without a test, or a
renamed or deleted test, fails here."""

from __future__ import annotations

import ast
import functools
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
NODE_ID = re.compile(r"`(test_\w+)::(test_\w+)`")


@functools.cache
def _tests_in(module: str) -> frozenset[str]:
    path = REPO / "tests" / f"{module}.py"
    if not path.exists():
        return frozenset()
    tree = ast.parse(path.read_text())
    return frozenset(node.name for node in tree.body
                     if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"))


def _rows_with_a_test_column(text: str) -> list[tuple[str, str]]:
    """(row, its test cell) for every row of every table whose last header is "test"."""
    rows, in_table = [], False
    for line in text.splitlines():
        if not line.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not in_table:   # a header row
            in_table, wanted = True, cells[-1] == "test"
            continue
        if wanted and not set(line) <= set("|-: "):
            rows.append((line, cells[-1]))
    return rows


def test_every_row_names_tests_that_exist():
    rows = _rows_with_a_test_column((REPO / "docs" / "robustness.md").read_text())
    assert len(rows) > 60
    for row, cell in rows:
        ids = NODE_ID.findall(cell)
        assert ids, f"a row without a `module::test` node id: {row}"
        assert len(ids) == len(re.findall(r"`[^`]+`", cell)), f"not a node id in: {row}"
        for module, name in ids:
            assert name in _tests_in(module), f"{module}::{name} does not exist ({row})"


def test_the_check_fails_on_a_row_without_a_test_or_with_a_missing_one():
    table = ("| input | message | test |\n|---|---|---|\n"
             "| a | b | `test_robustness_doc::test_every_row_names_tests_that_exist` |\n"
             "| c | d | test_reliability |\n"
             "| e | f | `test_reliability::test_that_is_not_there` |\n")
    rows = _rows_with_a_test_column(table)
    assert [bool(NODE_ID.findall(cell)) for _, cell in rows] == [True, False, True]
    assert "test_every_row_names_tests_that_exist" in _tests_in("test_robustness_doc")
    assert "test_that_is_not_there" not in _tests_in("test_reliability")
