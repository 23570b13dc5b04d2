"""The tables of committed results, byte for byte: each section of gedl_jax.evaluation.tables
renders what the one class of renderers it replaced rendered.

`eval_table.md` beside a run's `eval_results.json` is what the evaluation printed for it;
`tests/expected/two_runs_every_section_but_bootstrap.tex` is the LaTeX of two committed runs
made by the code before the sections were split (commit fc8d9fb), and holds every section but
the bootstrap intervals (tests/test_bootstrap.py checks those). Remake it only for a change of
the tables that is meant: `report.results_table(_two_runs(), fmt="latex")`, written to that
file."""

import json
import pathlib

import pytest

from gedl_jax.evaluation import report, tables

REPO = pathlib.Path(__file__).resolve().parents[1]
EXPECTED = REPO / "tests" / "expected" / "two_runs_every_section_but_bootstrap.tex"


def _results(path: str) -> dict:
    return json.loads((REPO / path).read_text())


@pytest.mark.parametrize("run", ["gedl_seed0", "edl_seed0"])
def test_a_committed_run_renders_its_eval_table_md(run):
    folder = REPO / "docs" / "results" / "cifar10_paper" / "runs" / run
    table = report.results_table([_results(str(folder / "eval_results.json"))])
    assert table + "\n" == (folder / "eval_table.md").read_text()


def _two_runs() -> dict[str, list[dict]]:
    return {"gedl": [_results("docs/results/mnist_long/posthoc_edl_family/gedl_seed0/"
                              "eval_results.json")],
            "gedl quick": [_results("docs/results/evaluation_quick/eval_results.json")]}


def test_two_committed_runs_render_every_section_as_before_in_latex():
    assert report.results_table(_two_runs(), fmt="latex") == EXPECTED.read_text()
    # every section but the bootstrap's printed, so the comparison covers them
    ctx = tables.Context.build(_two_runs(), True, None)
    assert [s.name for s in tables.SECTIONS if not s.render(ctx)] == ["bootstrap"]


def test_the_sections_print_in_their_list_order_and_extra_drops_all_but_the_main_ones():
    runs = {"gedl": [_results("docs/results/evaluation_quick/eval_results.json")]}
    ctx = tables.Context.build(runs, False, None)
    blocks = [b for s in tables.SECTIONS for b in s.render(ctx)]
    assert report.results_table(runs) == "\n\n".join(blocks) + "\n"
    main_only = [b for s in tables.SECTIONS if not s.extra for b in s.render(ctx)]
    assert report.results_table(runs, extra=False) == "\n\n".join(main_only) + "\n"
    assert [s.name for s in tables.SECTIONS if not s.extra] == ["main", "methods"]
