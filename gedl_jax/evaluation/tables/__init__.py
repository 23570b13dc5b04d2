"""The tables of ``results_table``, one module per section, each rendering its own rows.

``SECTIONS`` lists them in the order they print; each takes the ``Context`` (the rows, their
aggregated results, markdown or LaTeX) and returns its blocks (a header line, a table), or none
where the results do not hold its numbers. A new section is a function of a ``Context`` and a
line here.

- ``main``: the paper's main table; what each row ran.
- ``calibration``: NLL, Brier, the ECEs; post-hoc calibration before / after; the calibrators.
- ``detection``: every detection metric per set and score; the post-hoc OOD scores; near / far
  means; OpenOOD's trapezoidal AUPR.
- ``selective``: selective prediction, alone and with an OOD set in the pool (SCOD).
- ``conformal``: the conformal sets' coverage and size.
- ``bootstrap``: a single run's intervals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from gedl_jax.evaluation.tables import bootstrap, calibration, conformal, detection, main, selective
from gedl_jax.evaluation.tables.context import Context, set_labels

__all__ = ["SECTIONS", "Context", "Section", "render_sections", "set_labels"]


@dataclasses.dataclass(frozen=True)
class Section:
    """One table section: its name, its renderer, and whether it is one of the extra tables
    (`results_table(extra=True)`) rather than the main table's."""

    name: str
    render: Callable[[Context], list[str]]
    extra: bool = True


SECTIONS: tuple[Section, ...] = (
    Section("main", main.main_table, extra=False),
    Section("methods", main.method_descriptions, extra=False),
    Section("calibration", calibration.calibration_table),
    Section("detection", detection.detection_details),
    Section("posthoc_scores", detection.posthoc_scores),
    Section("selective", selective.selective),
    Section("scod", selective.scod),
    Section("conformal", conformal.conformal_sets),
    Section("ood_groups", detection.ood_groups),
    Section("trapezoidal", detection.trapezoidal_aupr),
    Section("bootstrap", bootstrap.bootstrap_intervals),
    Section("posthoc_calibration", calibration.posthoc_calibration),
    Section("calibrators", calibration.calibrators),
)


def render_sections(groups: Mapping[str, list], latex: bool, ood_names: Sequence[str] | None,
                    extra: bool = True) -> list[str]:
    """Every block of `SECTIONS` (the main table's only, without `extra`) for the rows
    `groups` ({method: [results of its seeds]}), in order."""
    ctx = Context.build(groups, latex, ood_names)
    return [block for section in SECTIONS if extra or not section.extra
            for block in section.render(ctx)]
