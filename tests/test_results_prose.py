"""Every number the results prose prints is in the committed results.

**Which text** (`documents`). The sections of README.md that state results (`README_RESULTS`),
every `docs/results/*/README.md`, the whole of `docs/reproduction.md`, and the NOTES.md of every
GPU check under `docs/results/gpu/` (a check's folder is the one holding its NOTES.md; the
README.md beside it is `tools/gpu_report.py`'s output, evidence, not prose), less: fenced and
indented code (an indented line that starts a block after a blank line; one that follows text
goes on with it, as a nested list item's next line does) and inline code (commands, names),
the sections headed as in `NOT_RESULTS_SECTIONS` (commands, provenance, a derivation: no
measured number), and the blocks a script writes, between `<!-- NAME.py: begin -->` and
`<!-- NAME.py: end -->`, which `test_generated_blocks_are_their_scripts_output` keeps equal to
the output of the script NAME.py beside the README.

**Which numbers.** Every decimal number (digits, a point, digits) of up to 4 decimals, at the
precision printed: 99.15 matches a value in [99.145, 99.155]. Not checked, because they are not
results:
- integers: they count epochs, seeds, images, steps and runs (and the few rounded integer
  percentages are left to review);
- numbers with more than one point (versions such as 3.12.3), and digits inside words or hashes;
- a number, or a range ("1.5-2 min"), followed by a unit of time or size (`min`, `h`, `s`,
  `ms`, `MB`, `MiB`, `GB`, `GiB`, spelt out or not) or by `x` (a speed ratio): wall times and
  sizes are provenance, not an evaluation;
- the settings, constants and uncommitted runs listed in `NOT_RESULTS`, per document, each with
  why; a listed number that no longer occurs fails `test_every_listed_number_still_occurs`.

**Where each must be found.** Among the committed results of the document's own folder (a
results README's, a GPU check's) and of every other `docs/results/` folder or file it links to
or names (`linked_sources`: a top folder of `docs/results/`, the GPU check's folder a link
points into, or a file of `docs/results/` itself such as `torch_reference_quick.md`)
(`Evidence`):
- the headline columns of the paper's tables (accuracy, Conf.MP, the MP/UM AUPR of KMNIST and
  Fashion-MNIST, of SVHN and CIFAR-100, and of CIFAR-10's far-OOD sets mnist_rgb32 and
  fashion_mnist_rgb32, in %) of every evaluation (`eval_results.json`, a GPU check's
  `train_eval_results.json`), every mean and sample standard deviation over seeds
  (`results.json`), the cells under those columns of a program's table of results
  (`results.md`, `table.md`: a table whose script is gone may be all there is), the paper's
  rows and printed stds (`gedl_jax.paper`), and, for the README's own folder, every epoch's
  evaluation (`metrics.jsonl`);
- gaps: the difference between two of those values of one column (evaluations, means, the
  paper's), between the printed numbers, so that "3.49 below" is checked as 98.20 - 94.71;
- the evaluations' other results (`RESULT_PATHS`: ECE and its over/under parts, Brier, NLL,
  the Dirichlet measures of each set, each OOD score's AUROC, validation accuracy; a fraction or
  in %), the post-hoc scores' AUPRs (a run's, and their means over seeds), the paper's
  calibration table, the training log's KL weight, strengths and loss;
- for the README's own folder, the numbers of the tables programs wrote there (`results.md`,
  `curves.md`, `fixed_point.md`, `evidence_split.md`, `table.md`: every `.md` but the README),
  and for every folder the output of its table scripts (`TABLE_SCRIPTS`);
- of a GPU check's folder, own or linked, every file but its NOTES.md and the earlier checks
  kept inside it (each evidence only where linked): its JSON (benchmarks, wall times, the
  environment), its records (`*.jsonl`), its logs and the tables `tools/gpu_report.py` and the
  benchmarks wrote;
- of a linked file, its numbers.

A table whose header line is that of a table a program wrote into the folder (e.g. a copy of
`evidence_split.md`) must hold only rows of that table, verbatim.

Where the text says which value a number is, the check is narrower:
- a table cell under one of the six headline columns must be a value of that column *for that
  row's method* (named in the row's first cell, else in the first `name` of the section's
  heading; the paper's row for "the paper"); a row about an epoch of a curve may also be any
  epoch's value; the number after a `±` must be one of that column's standard deviations;
- in a sentence, a number right after a column's name ("KMNIST MP 93.40", "accuracy is 99.37",
  "Fashion-MNIST UM (99.79") must be a value, standard deviation or gap of that column (or,
  where its line or the lines beside it speak of an epoch, an epoch's evaluation); a
  number of 50 or more right after a method's or reading's name ("RED's 99.52", "KL-PN (99.60")
  a value of that method, or of the paper's row for it, in any column, or a number of a row
  of a committed table that the method names in its first cell; the numbers that follow
  it joined by "/", "," or "and" ("99.60/99.59 and 99.77/99.75") likewise. A number followed by
  "points" is a gap, checked as any number.
Any other number in a sentence is checked against all of the above. That catches a number no
result holds, but not one changed into another result's value; among the many small numbers
(gaps, strengths, KL weights of every logged step) it catches little. The tables and the
numbers named by a column or method are where the check is strict.

A bold number in a results table must be the highest of its column in that table
(`bold_problems`).

Planted changes show that each check reports: a table cell, a number in a sentence, another
row's value in a cell and a moved bold mark in the long table's README
(`test_a_number_changed_by_hand_is_reported`), a generated block edited by hand, a changed
row of a copied program table in the 200-epoch README, a number after a column's name and
one in a plain sentence in docs/reproduction.md (and a copied row there) and in the H100's
NOTES.md, and the numbers those two quote from a linked file or an earlier check, reported once
the link is gone (`test_the_reproduction_guide_and_the_gpu_notes_are_checked`).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import importlib
import io
import itertools
import json
import pathlib
import re

import pytest
from training_fixtures import needs_committed_results

from gedl_jax import paper

REPO = pathlib.Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
pytestmark = needs_committed_results

# README.md's sections that state results: their numbers are checked (the rest of it describes
# the software).
README_RESULTS = ("Results and speed", "How the variants map to the paper")

# Headings (the text after the #s; a prefix matches) of sections with no measured number.
NOT_RESULTS_SECTIONS = (
    "Setting and command",
    "Command",
    "Provenance",
    "Why, in closed form",   # gedl_convergence: the derivation of the optimum (S* = 2.3636, ...)
)

# {document, relative to the repository: {number as printed: why it is not checked}}.
NOT_RESULTS: dict[str, dict[str, str]] = {
    "docs/results/mnist_long/README.md": {
        "2.364": "the closed form's optimum S* = W* + tau at tau = 1 (a derivation, not a run)",
        "0.007": "the tolerance of the linked ECE check, stated by its derivation",
    },
    "docs/results/mnist_medium/README.md": {
        n: "a one-off run of a side experiment whose workdir is not committed (the README says so)"
        for n in ("74.13", "10.28", "97.27", "87.26")},
    "docs/results/cifar10c_regenerated_quick/README.md": {
        n: "the two 40-step training runs' own evaluation, not committed (the README says so)"
        for n in ("10.00", "2.303", "2.304", "11.0", "9.9")},
    "docs/reproduction.md": {
        "3.13": "a Python version",
        "0.5": "settings: GEDL's C_w (the adaptive W's limit) and MC Dropout's rate",
        "0.3": "a setting: a C_w of the sensitivity grid",
        "0.7": "a setting: a C_w of the sensitivity grid",
    },
    "docs/results/gpu/nvidia_h100_80gb_hbm3/NOTES.md": {
        "0.1": "a test's tolerance (the share of a leaf's weights allowed past float32 rounding)",
    },
    "docs/results/gpu/nvidia_h200/earlier_78c8da6/NOTES.md": {
        "0.954": "a constant: erf(sqrt(2)), the range of the uniform draw that a truncated "
                 "normal at 2 standard deviations maps",
    },
    "docs/results/mnist_paper/README.md": {
        "2.36": "the closed form's S*, written as an expectation before the evaluation",
        "0.481": "the closed form's p* = 0.4808",
        "0.51": "the closed form's expected ECE, accuracy - p* (rounded)",
    },
}

# {folder: [(a script of its study, its arguments relative to the folder)]}: tables a script
# writes from the folder's runs; their numbers (the gaps and distances they compute) are results
# too. A study's scripts live in studies/<folder>/ (`study_script`).
TABLE_SCRIPTS = {
    "mnist_long": [("against_paper.py", []), ("posthoc_rows.py", [])],
    "cifar10_paper": [("um_by_set.py", [])],
    "gedl_convergence": [("machines.py", []), ("rank_readings.py", ["all_readings/results.json"])],
}

# The paper's columns, and on CIFAR-10 the far-OOD sets it did not use (their own columns).
OOD_COLUMNS = {"KMNIST": "kmnist", "FMNIST": "fashion_mnist", "SVHN": "svhn_cropped",
               "CIFAR-100": "cifar100", "mnist_rgb32": "mnist_rgb32",
               "fashion_mnist_rgb32": "fashion_mnist_rgb32"}
HEADLINE_PATHS = {
    "Acc": ("id", "accuracy"),
    "Conf.MP": ("id", "misclassification", "mp", "aupr"),
    **{f"{label} {score.upper()}": ("ood", name, "detection", score, "aupr_in")
       for label, name in OOD_COLUMNS.items() for score in ("mp", "um")},
}
# The same columns in a run's per-epoch evaluation (metrics.jsonl, split "epoch_eval").
EPOCH_EVAL_KEYS = {"Acc": "accuracy", "Conf.MP": "conf_mp",
                   **{f"{label} {score.upper()}": f"{name}_{score}"
                      for label, name in OOD_COLUMNS.items() for score in ("mp", "um")}}
# How a sentence names a column right before its number (a validation or training accuracy is
# not the test accuracy of the Acc column).
COLUMN_WORDS = {
    "Acc": r"(?:\bAcc|(?<!validation )(?<!training )\b[Aa]ccuracy)",
    "Conf.MP": r"Conf\.MP",
    "KMNIST MP": r"KMNIST MP", "KMNIST UM": r"KMNIST UM",
    "FMNIST MP": r"(?:FMNIST|Fashion-MNIST) MP", "FMNIST UM": r"(?:FMNIST|Fashion-MNIST) UM",
    "SVHN MP": r"SVHN MP", "SVHN UM": r"SVHN UM",
    "CIFAR-100 MP": r"CIFAR-100 MP", "CIFAR-100 UM": r"CIFAR-100 UM",
    "mnist_rgb32 MP": r"(?<!fashion_)mnist_rgb32 MP",
    "mnist_rgb32 UM": r"(?<!fashion_)mnist_rgb32 UM",
    "fashion_mnist_rgb32 MP": r"fashion_mnist_rgb32 MP",
    "fashion_mnist_rgb32 UM": r"fashion_mnist_rgb32 UM",
}
# The other results of an evaluation that the prose quotes (a value, or a mean and std).
RESULT_PATHS = (("id", "ece"), ("id", "ece_overconfidence"), ("id", "ece_underconfidence"),
                ("id", "brier"), ("id", "nll"), ("id", "uncertainty", "*"),
                ("ood", "*", "uncertainty", "*"), ("ood", "*", "detection", "*", "auroc"),
                ("validation", "accuracy"))
# A run's post-hoc OOD scores (its "posthoc" section): detection and misclassification AUPR.
POSTHOC_PATHS = (("posthoc", "ood", "*", "detection", "*", "aupr_in"),
                 ("posthoc", "misclassification", "*", "aupr"))
# The training log's values that the prose quotes (metrics.jsonl, split "train").
LOG_KEYS = ("kl_weight", "mean_strength", "mean_prior_strength", "loss")

NUMBER = re.compile(r"(?<![\w.])[+-]?(\d+\.\d+)(?![\w]|\.\d)")
UNIT_AFTER = re.compile(r"(?:[-–]\d+(?:\.\d+)?)?\s?"      # a range's end: "1.5-2 min"
                        r"(?:min|minutes?|h|hours?|s|seconds?|ms|MB|MiB|GB|GiB|x)\b")
POINTS_AFTER = re.compile(r"\s?points?\b")
BLOCK = re.compile(r"<!-- ([\w.]+\.py): begin -->\n(.*?)<!-- \1: end -->\n", re.S)
LINK = re.compile(r"\]\(([^)#\s]+)|(?<![\w/])(docs/results/[\w./-]*\w)")
COLUMN_BEFORE = {c: re.compile(w + r"(?:\s+is|\s*=|\s*:|\s*\()?\s*$")
                 for c, w in COLUMN_WORDS.items()}
# How a sentence names a method or reading right before its number: "RED's 99.52",
# "F-EDL (99.79", "`kl_masked` (0.46" (a number under 50 after a name is not held to it).
METHOD_BEFORE = re.compile(r"(GEDL|I-EDL|R-EDL|F-EDL|EDL|RED|DAEDL|PostNet|RKL-PN|KL-PN|DUQ|"
                           r"MC Dropout|ensemble|`[a-z_0-9]+`)(?:'s)?(?:\s+is|\s*:|\s*\()?\s*$")


def method_key(name: str) -> str:
    """A method's or reading's name as the runs and the tables spell it, reduced to compare:
    `rkl_pn`, RKL-PN -> "rklpn"; "ensemble (5)" -> "ensemble"."""
    name = re.sub(r"\(.*?\)", "", name).split(",")[0]
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _printed(value: float, decimals: int) -> str:
    return f"{abs(value):.{decimals}f}"


def _prints_as(text: str, pool) -> bool:
    """Whether a value of the pool prints as `text` (at its decimals)."""
    decimals = len(text.split(".")[1])
    near, half = float(text), 0.6 * 10.0 ** -decimals
    return any(_printed(v, decimals) == text for v in pool if abs(abs(v) - near) <= half)


class Evidence:
    """The numbers a document may print, from the committed results of its folder (`own`) and
    of the folders and files it links to (`linked`)."""

    def __init__(self, own: list[pathlib.Path], linked: list[pathlib.Path]):
        self.values: set[float] = set()
        # (method, column) -> each run's final evaluation, each mean over seeds, the paper's
        self.finals: dict[tuple[str, str], set[float]] = collections.defaultdict(set)
        self.own_finals: dict[tuple[str, str], set[float]] = collections.defaultdict(set)
        self.epochs: dict[tuple[str, str], set[float]] = collections.defaultdict(set)
        self.stds: dict[str, set[float]] = collections.defaultdict(set)
        # method -> its runs' post-hoc scores' AUPRs (`POSTHOC_PATHS`), which a sentence may
        # quote after the method's name like a headline value
        self.posthoc: dict[str, set[float]] = collections.defaultdict(set)
        # method -> the numbers of its rows in the committed texts' tables (a row's first cell
        # names it), which a sentence may quote after the method's name
        self.rows: dict[str, set[float]] = collections.defaultdict(set)
        # header line of a table a program wrote -> its rows (a README may copy rows of it)
        self.tables: dict[str, list[str]] = {}
        # (folder of the runs, method, column, step) -> each seed's value: for the curves' means
        self._curves: dict[tuple, list[float]] = collections.defaultdict(list)
        for folder in own:
            self._add_folder(folder, own=True)
        self.own_finals.update({k: set(v) for k, v in self.finals.items()})
        for (_, method, column, _), seeds in self._curves.items():
            if len(seeds) > 1:
                self.epochs[method, column].add(sum(seeds) / len(seeds))
        for folder in linked:
            self._add_folder(folder, own=False)
        self._add_paper()
        self.gaps: dict[str, set[float]] = {}
        for column in HEADLINE_PATHS:
            finals = self.of_column(self.finals, column)
            self.values |= finals | self.of_column(self.epochs, column) | self.stds[column]
            printed = sorted({round(v, 2) for v in finals})
            self.gaps[column] = {b - a for a, b in itertools.combinations(printed, 2)}
            self.values |= self.gaps[column]
        self._sorted = sorted({abs(v) for v in self.values})
        self.methods = {method for method, _ in self.finals}

    @staticmethod
    def of_column(pool: dict, column: str, method: str | None = None) -> set[float]:
        return set().union(*[v for (m, c), v in pool.items()
                             if c == column and method in (None, m)])

    def has(self, text: str) -> bool:
        """Whether a value prints as `text` at its decimals (any with more than 4)."""
        decimals = len(text.split(".")[1])
        if decimals > 4:
            return True
        near, half = float(text), 0.6 * 10.0 ** -decimals
        start = bisect.bisect_left(self._sorted, near - half)
        end = bisect.bisect_right(self._sorted, near + half)
        return any(_printed(v, decimals) == text for v in self._sorted[start:end])

    def in_column(self, text: str, column: str, method: str | None = None,
                  epochs: bool = False, std: bool = False) -> bool:
        if std:
            pool = self.stds[column]
        else:
            pool = (self.in_method(method, column) if method
                    else self.of_column(self.finals, column))
            if epochs:
                pool |= self.of_column(self.epochs, column, method)
        return _prints_as(text, pool)

    def named(self, text: str, kind: str, key: str, epochs: bool) -> bool:
        """Whether a number a sentence prints after a column's name is a value, std or gap of
        that column (any epoch's value where `epochs`: the line speaks of an epoch); after a
        method's name, a value of that method or of the paper's row for it (any column)."""
        if kind == "column":
            pool = self.of_column(self.finals, key) | self.stds[key] | self.gaps[key]
            if epochs:
                pool |= self.of_column(self.epochs, key)
        else:
            pool = set().union(*[self.in_method(key, c) | self.finals["paper" + key, c]
                                 for c in HEADLINE_PATHS], self.posthoc[key], self.rows[key])
        return _prints_as(text, pool)

    def in_method(self, method: str, column: str) -> set[float]:
        own = self.of_column(self.own_finals, column, method)
        return own or self.of_column(self.finals, column, method)

    def _add_folder(self, source: pathlib.Path, own: bool) -> None:
        """A results folder's files, or one linked results file (a table, a log). A GPU
        check's folder (`is_check`) is evidence whole: its JSON, its records, its logs and the
        README that `tools/gpu_report.py` wrote, less its NOTES.md (prose) and the earlier checks
        kept in it (each its own folder, evidence where a text links to it)."""
        check = is_check(source)
        for path in _files_of(source):
            method = method_key(path.parent.name.rsplit("_seed", 1)[0])
            if path.suffix == ".json":
                self._add_result(_parsed(path), method, path.name)
            elif path.suffix == ".jsonl" and (own or check):
                study = path.parent.parent
                for row in _parsed(path):
                    self._add_log_row(row, method, study)
            elif path.suffix == ".md" and path.name != "NOTES.md" and (
                    own and path.name != "README.md" or path.name in ("results.md", "table.md")
                    or check or path == source):
                self._add_text(path.read_text(), path.name in ("results.md", "table.md"))
            elif path.suffix in (".log", ".txt") and (check or path == source):
                self._add_text(path.read_text())
        for script, arguments in TABLE_SCRIPTS.get(source.name, []):
            self._add_text(_output_of(study_script(source, script),
                                      tuple(str(source / a) for a in arguments)))

    def _add_text(self, text: str, results_table: bool = False) -> None:
        """A committed text's numbers; each table row's numbers as values of the method its
        first cell names; and where the text is a program's table of results (`results_table`:
        `results.md`, `table.md`), each cell under a headline column as a value of it (a
        table of means: the number after a `±` as a standard deviation)."""
        numbers, tables, rows, cells = _text_facts(text)
        self.values |= numbers
        for header, table_rows in tables:
            self.tables.setdefault(header, []).extend(table_rows)
        for method, values in rows:
            self.rows[method] |= values
        if results_table:
            for column, mean, std in cells:
                self.finals["a program's table", column].add(mean)
                if std is not None:
                    self.stds[column].add(std)

    def _add_log_row(self, row: dict, method: str, study: pathlib.Path) -> None:
        if row.get("split") == "epoch_eval":
            for column, key in EPOCH_EVAL_KEYS.items():
                if key in row:
                    self.epochs[method, column].add(100 * row[key])
                    self._curves[study, method, column, row["step"]].append(100 * row[key])
            self.values |= {float(v) for k, v in row.items() if k.endswith("_strength")}
        elif row.get("split") == "train":
            self.values |= {float(row[k]) for k in LOG_KEYS if k in row}
        elif row.get("split") == "validation" and "accuracy" in row:
            self.values.add(100 * row["accuracy"])

    def _add_result(self, result, method: str, name: str) -> None:
        """An evaluation (eval_results.json; a GPU check's train_eval_results.json), or a
        study's table of them (results.json); of any other JSON (the corruption study's, a
        provenance record, a benchmark) every number."""
        if not name.endswith("eval_results.json") and name != "results.json":
            for keys, value in _leaves(result):
                self.values |= {value, 100 * value}
                if "accuracy" in keys:
                    self.finals[method, "Acc"].add(100 * value)
            return
        if not isinstance(result, dict):
            return
        runs = [(method, result)] + [(method_key(name), run) for name, run
                                     in result.get("aggregate", {}).items()]
        for name, run in runs:
            if not isinstance(run, dict):
                continue
            for column, path in HEADLINE_PATHS.items():
                node = _get(run, path)
                if isinstance(node, dict) and node.get("mean") is not None:   # over seeds
                    self.finals[name, column].add(100 * node["mean"])
                    if node.get("std") is not None:
                        self.stds[column].add(100 * node["std"])
                elif isinstance(node, (int, float)):                       # one run
                    self.finals[name, column].add(100 * node)
            for path in POSTHOC_PATHS:   # a run's AUPRs, or their means over seeds
                scores = {100 * (v["mean"] if isinstance(v, dict) else v)
                          for v in _glob(run, path)
                          if isinstance(v, (int, float)) or isinstance(v, dict) and "mean" in v}
                self.posthoc[name] |= scores
                self.values |= scores
            for path in RESULT_PATHS:
                for node in _glob(run, path):
                    values = ([node.get("mean"), node.get("std")] if isinstance(node, dict)
                              else [node])
                    for value in values:
                        if isinstance(value, (int, float)) and not isinstance(value, bool):
                            self.values |= {float(value), 100 * float(value)}

    def _add_paper(self) -> None:
        """The paper's rows (`gedl_jax.paper`): its main tables' means under their columns, its
        printed stds, and its CIFAR-10 calibration table."""
        for dataset, table in paper.PAPER.items():
            stds = paper.PAPER_STD.get(dataset, {})
            for name, row in table.items():
                if name == "columns":
                    continue
                for i, (column, value) in enumerate(zip(table["columns"], row)):
                    if value is None:
                        continue
                    self.finals["paper" + method_key(name), column].add(float(value))
                    if name == "gedl":                     # "the paper" of the GEDL tables
                        self.finals["thepaper", column].add(float(value))
                    std = stds.get(name, [None] * len(row))[i]
                    if std is not None:
                        self.stds[column].add(float(std))
        for table, stds in ((paper.CALIBRATION, paper.CALIBRATION_STD),):
            for dataset, rows in table.items():
                for name, row in rows.items():
                    if name != "columns":
                        self.values |= {float(v) for v in row}
                        self.values |= {float(v) for v in stds.get(dataset, {}).get(name, [])}


def _column_named(head: str) -> str | None:
    """The headline column a program's table heads a column with ("Acc (mnist)",
    "mnist→kmnist MP", "fashion_mnist UM"), or None."""
    head = re.sub(r"\(.*?\)", "", head).strip(" *").split("→")[-1].strip()
    if head in HEADLINE_PATHS:
        return head
    words = head.split()
    labels = {name: label for label, name in OOD_COLUMNS.items()} | {"fmnist": "FMNIST"}
    if len(words) == 2 and words[0].lower() in labels and words[1] in ("MP", "UM"):
        return f"{labels[words[0].lower()]} {words[1]}"
    return None


def _get(node, path):
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _leaves(node, path=()):
    """(keys, number) of every number in a JSON document."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(node, list):
        for value in node:
            yield from _leaves(value, path)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield path, float(node)


def _glob(node, path):
    """The nodes at path, where "*" stands for every key of its level."""
    if not path:
        yield node
        return
    if isinstance(node, dict):
        for key in (node if path[0] == "*" else [path[0]] if path[0] in node else []):
            yield from _glob(node[key], path[1:])


def study_script(folder: pathlib.Path, name: str) -> pathlib.Path:
    """The script `name` of the study whose results are in docs/results/<folder>."""
    return REPO / "studies" / folder.name / name


@functools.cache
def _text_facts(text: str) -> tuple:
    """A text's numbers; its tables, as (header line, rows); each table row's numbers, as
    (method its first cell names, numbers); and each "mean" or "mean ± std" cell under a
    headline column, as (column, mean, std or None). Parsed once per text."""
    numbers = frozenset(float(m.group(1)) for m in NUMBER.finditer(text))
    tables, rows, cells = [], [], []
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("|") and lines[i + 1].startswith("|---"):   # a table's header
            table_rows = list(itertools.takewhile(lambda row: row.startswith("|"), lines[i + 2:]))
            tables.append((line, table_rows))
            columns = [_column_named(c) for c in line.strip("|").split("|")]
            for row in table_rows:
                row_cells = [c.strip(" *") for c in row.strip("|").split("|")]
                rows.append((method_key(row_cells[0]), frozenset(
                    float(m.group(1)) for c in row_cells[1:] for m in NUMBER.finditer(c))))
                for column, cell in zip(columns, row_cells):
                    mean = re.fullmatch(r"(\d+\.\d+)(?:\s*±\s*(\d+\.\d+))?", cell)
                    if column and mean:
                        cells.append((column, float(mean[1]),
                                      float(mean[2]) if mean[2] else None))
    return numbers, tables, rows, cells


@functools.cache
def _parsed(path: pathlib.Path):
    """A JSON file's document, or a JSON-lines file's rows (read once: several documents read
    the same results)."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def is_check(folder: pathlib.Path) -> bool:
    """Whether the folder is a GPU check's (`tools/gpu_check.sh`): it holds the NOTES.md that
    reads its files."""
    return folder.is_dir() and (folder / "NOTES.md").is_file()


def _files_of(source: pathlib.Path) -> list[pathlib.Path]:
    """The file itself, or a folder's files, less those of the checks nested in a check's
    folder."""
    if source.is_file():
        return [source]
    files = sorted(p for p in source.rglob("*") if p.is_file())
    if not is_check(source):
        return files
    nested = tuple(f"{p.parent}/" for p in files if p.name == "NOTES.md" and p.parent != source)
    return [p for p in files if not str(p).startswith(nested)]


@functools.cache
def _output_of(script: pathlib.Path, arguments: tuple[str, ...]) -> str:
    """The script's output (run once per arguments)."""
    module = importlib.import_module(".".join(script.relative_to(REPO).with_suffix("").parts))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert module.main(list(arguments)) == 0, f"{script} {arguments} failed"
    return out.getvalue()


# ----------------------------------------------------------------------------- the text

def results_text(readme: pathlib.Path, text: str) -> list[tuple[int, str, str]]:
    """[(line number, line, the heading it is under)] of the checked text: the results
    sections, less code, unchecked sections, and generated blocks."""
    text = BLOCK.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    is_top = readme == REPO / "README.md"
    checked, heading, chapter, in_code, in_section = [], "", "", False, not is_top
    previous, indented = "", False
    for number, line in enumerate(text.splitlines(), 1):
        # An indented line is code where it starts a block (after a blank line) or goes on
        # with one; after text it goes on with that text (a nested list item's next line).
        indented = line.startswith("    ") and (indented or not previous.strip())
        previous = line
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or indented:
            continue
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            if is_top:
                chapter = heading if line.startswith("## ") else chapter
                in_section = chapter in README_RESULTS or heading in README_RESULTS
            continue
        if in_section and not heading.startswith(NOT_RESULTS_SECTIONS):
            checked.append((number, re.sub(r"`[^`]*`", _blank_code, line), heading))
    return checked


def _blank_code(match: re.Match) -> str:
    """Inline code is blanked (its numbers are commands, not results), but a name such as
    `kl_masked` is kept: it says which reading a number belongs to."""
    code = match.group(0)
    return code if re.fullmatch(r"`[a-z_][a-z_0-9]*`", code) else " " * len(code)


def linked_sources(document: pathlib.Path, text: str) -> list[pathlib.Path]:
    """Every docs/results folder or file, other than its own folder, that the document links
    to or names: a results folder (the top one under docs/results, or the GPU check's folder
    the link is in), or a file directly in docs/results (a table or log of its own)."""
    sources = []
    for match in LINK.finditer(text):
        target = (document.parent / match.group(1) if match.group(1)
                  else REPO / match.group(2)).resolve()
        try:
            relative = target.relative_to(RESULTS.resolve())
        except ValueError:
            continue
        if not relative.parts or not target.exists():
            continue
        checks = [f for f in [target, *target.parents] if is_check(f)
                  and RESULTS.resolve() in f.parents]
        source = (RESULTS / checks[0].relative_to(RESULTS.resolve()) if checks
                  else RESULTS / relative.parts[0])
        if source != document.parent and source not in sources:
            sources.append(source)
    return sources


def unsupported(name: str, text: str, evidence: Evidence, allowed: dict[str, str],
                readme: pathlib.Path) -> list[str]:
    """'file:line: number ...' for every checked number the evidence lacks."""
    problems = []
    header: list[str] = []
    previous = None
    raw = text.splitlines()
    copied_from: list[str] | None = None
    for number, line, heading in results_text(readme, text):
        is_row = line.startswith("|")
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if is_row else [line]
        if is_row and previous != number - 1:               # a table's first row: its header
            header, previous = cells, number
            copied_from = evidence.tables.get(raw[number - 1].strip())
            continue
        previous = number if is_row else None
        if is_row and copied_from is not None and not set(line) <= set("|-: "):
            if raw[number - 1].strip() not in copied_from:  # a copy of a program's table
                problems.append(f"{name}:{number}: this row is not in the committed table with "
                                f"the same header (a program's output): {raw[number - 1]!r}")
            continue
        row_method = None
        if is_row:
            label = method_key(cells[0].strip("* `"))
            in_heading = re.search(r"`([^`]+)`", heading)
            row_method = (label if label in evidence.methods
                          else method_key(in_heading.group(1)) if in_heading else None)
            row_method = row_method if row_method in evidence.methods else None
        of_an_epoch = is_row and "epoch" in cells[0] and "evaluated" not in cells[0]
        for i, cell in enumerate(cells):
            head = header[i].strip("* ") if is_row and i < len(header) else ""
            column = head if head in HEADLINE_PATHS else None
            inherited, last_end = None, None
            for match in NUMBER.finditer(cell):
                printed = match.group(1)
                between = cell[last_end:match.start()] if last_end is not None else None
                last_end = match.end()
                if UNIT_AFTER.match(cell, match.end()) or printed in allowed:
                    inherited = None
                    continue
                where = f"{name}:{number}: {printed}"
                if column is not None:                      # a table cell of a headline column
                    std = cell[:match.start()].rstrip().endswith("±")
                    if not evidence.in_column(printed, column, row_method, of_an_epoch, std):
                        what = "std" if std else "value"
                        of = f" of {row_method}" if row_method and not std else ""
                        problems.append(f"{where} is no {what} of column {column}{of} in the "
                                        f"committed results: {cell!r}")
                    continue
                if head.startswith("the paper's row") and row_method:
                    kind, key = "method", "paper" + row_method
                elif between is not None and re.fullmatch(r"\s*(?:/|,|and)\s*", between):
                    kind, key = inherited or (None, None)   # "99.60/99.59 and 99.77/99.75"
                else:
                    kind, key = _named_before(cell[:match.start()], evidence)
                gap = POINTS_AFTER.match(cell, match.end())
                if gap or kind == "method" and float(printed) < 50:
                    kind, key = None, None   # a gap ("0.21 points"), a std, ECE or distance
                inherited = (kind, key)
                context = f"...{cell[max(0, match.start() - 40):match.end() + 20]}..."
                about_an_epoch = "epoch" in " ".join(raw[max(0, number - 2):number + 1])
                if kind is not None and not evidence.named(printed, kind, key, about_an_epoch):
                    problems.append(f"{where} is no value of {kind} {key} in the committed "
                                    f"results: {context}")
                elif kind is None and not evidence.has(printed):
                    problems.append(f"{where} is in no committed result: {context}")
    return problems


def _named_before(before: str, evidence: Evidence) -> tuple[str | None, str | None]:
    """("column", name) or ("method", key) when the text right before a number names one."""
    for column, pattern in COLUMN_BEFORE.items():
        if pattern.search(before):
            return "column", column
    match = METHOD_BEFORE.search(before)
    if match and method_key(match.group(1)) in evidence.methods:
        return "method", method_key(match.group(1))
    return None, None


def documents() -> list[pathlib.Path]:
    """The checked texts: README.md (its results sections), every results folder's README, the
    reproduction guide, and the NOTES.md of every GPU check."""
    return ([REPO / "README.md"] + sorted(RESULTS.glob("*/README.md"))
            + [REPO / "docs" / "reproduction.md"] + sorted((RESULTS / "gpu").rglob("NOTES.md")))


_EVIDENCE: dict[tuple, Evidence] = {}


def evidence_for(document: pathlib.Path, text: str) -> Evidence:
    """A results folder's README, and a GPU check's NOTES.md, read their own folder's files;
    any document, the results it links to (`linked_sources`)."""
    own = ([document.parent] if document.parent.parent == RESULTS or is_check(document.parent)
           else [])
    linked = linked_sources(document, text)
    key = (tuple(own), tuple(linked))
    if key not in _EVIDENCE:
        _EVIDENCE[key] = Evidence(own, linked)
    return _EVIDENCE[key]


def check(readme: pathlib.Path, text: str | None = None) -> list[str]:
    """The problems of the README's results prose (of `text`, if given, as if it were the
    README's)."""
    text = readme.read_text() if text is None else text
    name = str(readme.relative_to(REPO))
    return unsupported(name, text, evidence_for(readme, text), NOT_RESULTS.get(name, {}), readme)


# ----------------------------------------------------------------------------- the tests

@pytest.mark.parametrize("readme", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_number_in_the_results_prose_is_in_the_committed_results(readme):
    problems = check(readme)
    assert not problems, "\n".join(problems)


def block_problems(readme: pathlib.Path, text: str) -> list[str]:
    """A block between `<!-- NAME.py: begin -->` and `<!-- NAME.py: end -->` that is not the
    output of the study's script NAME.py (`study_script`)."""
    problems = []
    for match in BLOCK.finditer(text):
        script = study_script(readme.parent, match.group(1))
        if match.group(2) != _output_of(script, ()):
            line = text[:match.start()].count("\n") + 1
            problems.append(f"{readme.relative_to(REPO)}:{line}: the block of {script.name} is "
                            f"not its output; paste the output of "
                            f"`python {script.relative_to(REPO)}` between the markers")
    return problems


@pytest.mark.parametrize("readme", [p for p in documents() if BLOCK.search(p.read_text())],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_generated_blocks_are_their_scripts_output(readme):
    problems = block_problems(readme, readme.read_text())
    assert not problems, "\n".join(problems)


def test_a_generated_block_edited_by_hand_is_reported():
    readme = RESULTS / "mnist_long" / "README.md"
    text = readme.read_text()
    row = "| mc_dropout | 3 | -0.11 | -0.09 | -0.60 |"
    assert row in text and block_problems(readme, text) == []
    problems = block_problems(readme, text.replace(row, row.replace("-0.60", "+0.60")))
    assert len(problems) == 1 and "the block of against_paper.py is not its output" in problems[0]


def bold_problems(name: str, text: str) -> list[str]:
    """Where a results table marks numbers in bold ("the highest mean of the column"): each bold
    number must be the largest of its column in that table (the paper's rows aside), and every
    number equal to it bold."""
    problems = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if not (line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|---")):
            continue
        rows = [r.strip().strip("|").split("|")
                for r in itertools.takewhile(lambda r: r.startswith("|"), lines[i + 2:])]
        for column in range(1, len(line.strip().strip("|").split("|"))):
            cells = [r[column].strip() for r in rows
                     if column < len(r) and not r[0].strip().startswith("the paper")]
            values = [(float(m.group(1)), c.startswith("**")) for c in cells
                      if (m := re.fullmatch(r"\**(\d+\.\d+)\**", c))]
            if any(bold for _, bold in values):
                best = max(v for v, _ in values)
                if not all(bold == (v == best) for v, bold in values):
                    problems.append(f"{name}:{i + 1}: column {column + 1}: bold marks "
                                    f"{[v for v, b in values if b]}, the highest is {best}")
    return problems


@pytest.mark.parametrize("readme", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_a_bold_number_is_the_highest_of_its_column(readme):
    problems = bold_problems(str(readme.relative_to(REPO)), readme.read_text())
    assert not problems, "\n".join(problems)


def test_every_listed_number_still_occurs():
    for name, allowed in NOT_RESULTS.items():
        text = (REPO / name).read_text()
        for printed in allowed:
            assert re.search(rf"(?<![\w.]){re.escape(printed)}(?![\w]|\.\d)", text), (
                f"NOT_RESULTS[{name!r}] lists {printed}, which no longer occurs there")


def test_a_number_changed_by_hand_is_reported(tmp_path):
    """A copy of the long table's README with one table cell and one number in a sentence
    changed by hand: each is reported, with its line; the committed README passes."""
    readme = RESULTS / "mnist_long" / "README.md"
    text = readme.read_text()
    assert check(readme, text) == []
    cell, sentence = "| MC Dropout | 99.15 | 99.89 | 93.40 |", "KMNIST MP 93.40 against"
    assert cell in text and sentence in text
    evidence = evidence_for(readme, text)
    assert not evidence.in_column("93.47", "KMNIST MP", epochs=True)   # a value no run has
    copy = tmp_path / "README.md"
    copy.write_text(text.replace(cell, cell.replace("93.40", "93.47"))
                    .replace(sentence, sentence.replace("93.40", "93.47")))
    planted = copy.read_text()
    problems = check(readme, planted)
    lines = [n for n, line in enumerate(planted.splitlines(), 1) if "93.47" in line]
    assert len(problems) == 2 and len(lines) == 2, problems
    assert problems[0].startswith(f"docs/results/mnist_long/README.md:{lines[0]}: 93.47 is no "
                                  "value of column KMNIST MP of mcdropout")
    assert problems[1].startswith(f"docs/results/mnist_long/README.md:{lines[1]}: 93.47 is no "
                                  "value of column KMNIST MP")
    # Another row's value in this row's cell is reported too: GEDL's 89.88 as MC Dropout's.
    swapped = text.replace(cell, cell.replace("93.40", "89.88"))
    assert any("89.88 is no value of column KMNIST MP of mcdropout" in p
               for p in check(readme, swapped))
    # A bold mark moved to a number that is not the column's highest.
    ensemble, rkl_pn = "| ensemble (5) | **99.44** |", "| RKL-PN | 99.43 |"
    assert ensemble in text and rkl_pn in text and bold_problems("x", text) == []
    moved = (text.replace(ensemble, "| ensemble (5) | 99.44 |")
             .replace(rkl_pn, "| RKL-PN | **99.43** |"))
    header = text[:text.index("| row | Acc |")].count("\n") + 1
    assert bold_problems("x", moved) == [f"x:{header}: column 2: bold marks [99.43], "
                                         "the highest is 99.44"]


def test_a_changed_row_of_a_copied_program_table_is_reported():
    """The 200-epoch README copies rows of its evidence_split.md: a changed number in one is
    reported, with its line."""
    readme = RESULTS / "mnist_paper" / "README.md"
    text = readme.read_text()
    row = "| kmnist | 10000 | 1.412 | 1.202 | 0.832 | 0.474 | 0.832 | 0.714 |"
    assert row in text and row in (readme.parent / "evidence_split.md").read_text()
    line = text[:text.index(row)].count("\n") + 1
    problems = check(readme, text.replace(row, row.replace("0.474", "0.471")))
    assert len(problems) == 1 and problems[0].startswith(
        f"docs/results/mnist_paper/README.md:{line}: this row is not in the committed table")


def test_the_reproduction_guide_and_the_gpu_notes_are_checked():
    """docs/reproduction.md and a GPU check's NOTES.md are checked like a results README: a
    number changed by hand in a sentence, in a copied program table and after a column's name
    is reported, with its line; and a number they quote from a linked results file
    (torch_reference_quick.md) or an earlier check's folder counts only while they link to
    it."""
    guide = REPO / "docs" / "reproduction.md"
    text = guide.read_text()
    assert check(guide, text) == []
    planted = {"KMNIST UM 34.11": "KMNIST UM 34.19",        # after a column's name
               "loss 0.2132 in float64": "loss 0.2138 in float64",   # a plain sentence
               "| gedl | torch | 1 | 98.12 |": "| gedl | torch | 1 | 98.13 |"}   # a copied row
    changed = text
    for old, new in planted.items():
        assert text.count(old) == 1
        changed = changed.replace(old, new)
    lines = {new: changed[:changed.index(new)].count("\n") + 1 for new in planted.values()}
    problems = check(guide, changed)
    assert len(problems) == 3, problems
    assert problems[0].startswith(f"docs/reproduction.md:{lines['KMNIST UM 34.19']}: 34.19 is "
                                  "no value of column KMNIST UM")
    assert problems[1].startswith(f"docs/reproduction.md:{lines['loss 0.2138 in float64']}: "
                                  "0.2138 is in no committed result")
    assert problems[2].startswith(f"docs/reproduction.md:{lines['| gedl | torch | 1 | 98.13 |']}"
                                  ": this row is not in the committed table")
    # The stationary point's loss is in the linked file alone: unlinked, it is reported.
    unlinked = text.replace("torch_reference_quick.md", "torch_reference_elsewhere.md")
    assert RESULTS / "torch_reference_quick.md" in linked_sources(guide, text)
    assert any(p.split(": ")[1] == "0.2132 is in no committed result"
               for p in check(guide, unlinked))

    notes = RESULTS / "gpu" / "nvidia_h100_80gb_hbm3" / "NOTES.md"
    text = notes.read_text()
    assert check(notes, text) == []
    cell, sentence = "KMNIST MP 82.03 /", "loss 1.754 there"
    assert text.count(cell) == 1 and text.count(sentence) == 1
    changed = text.replace(cell, "KMNIST MP 82.08 /").replace(sentence, "loss 1.751 there")
    lines = [changed[:changed.index(new)].count("\n") + 1 for new in ("82.08", "1.751")]
    name = "docs/results/gpu/nvidia_h100_80gb_hbm3/NOTES.md"
    problems = check(notes, changed)
    assert len(problems) == 2, problems
    assert problems[0].startswith(f"{name}:{lines[0]}: 82.08 is no value of column KMNIST MP")
    assert problems[1].startswith(f"{name}:{lines[1]}: 1.751 is in no committed result")
    # The H200's run at 4359033 is the linked earlier check's: unlinked, its numbers are
    # reported (the loss of its first record, its KMNIST MP).
    unlinked = text.replace("earlier_4359033/", "earlier_0000000/")
    reported = {p.split(": ")[1].split()[0] for p in check(notes, unlinked)}
    assert {"1.754", "82.03", "30.98"} <= reported, reported
