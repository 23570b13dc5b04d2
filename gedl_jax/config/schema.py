"""The views of the schema (`fields.ALL`): each field's facts by name, the enumerations the
validation and the command lines read, and the help that lists every field.

>>> ALLOWED["likelihood"]
('digamma', 'log', 'mse', 'mse_novar', 'fisher_mse')
>>> LIST_FIELDS["seeds"], "plots" in RESUME_SAFE_FIELDS, "learning_rate" in RESUME_SAFE_FIELDS
(<class 'int'>, True, False)
"""

from __future__ import annotations

from typing import Any

from gedl_jax.config.fields import ALL, Field, PerDataset

FIELDS: dict[str, Field] = {f.name: f for f in ALL}
# Allowed values of every enumerated field: validation errors list them. `method` is any
# method a preset names (`presets.method_names`): a new method's preset is what makes it allowed.
ALLOWED: dict[str, tuple[Any, ...]] = {n: f.allowed for n, f in FIELDS.items()
                                       if f.allowed is not None}
# Fields holding lists, with their item type: tuples in the config (`values.normalize_lists`).
LIST_FIELDS: dict[str, type] = {n: f.items for n, f in FIELDS.items() if f.items is not None}
# Fields that do not change the trained parameters: a resumed run may change them.
RESUME_SAFE_FIELDS = frozenset(n for n, f in FIELDS.items() if f.resume_safe)

# The groups, in the order the help and the reference show them, with a line each.
GROUPS: dict[str, str] = {
    "header": "what the preset recorded",
    "data": "the in-distribution set, its OOD sets, the data folder and downloads",
    "model": "the network and its numerics",
    "method": "the method (gedl_jax.methods) and its own settings",
    "baseline": "the reading of the non-EDL baselines",
    "prior": "prior: base rate a, prior strength W (Eq. e2alpha, weight_update)",
    "posterior": "posterior update: the KL weight 1/tau and its schedule (Eq. elbo, "
                 "tau_schedule)",
    "objective": "objective: the data term, the KL's target, I-EDL's and RED's terms",
    "optimisation": "optimisation (the paper's Table implementation_details)",
    "loop": "the training loop: seeds, logging, checkpoints, devices and hosts",
    "evaluation": "evaluation extras (docs/evaluation.md); none changes a default result",
}


def fields_by_group() -> dict[str, list[Field]]:
    """{group: its fields in the table's order}, the groups in `GROUPS`' order."""
    out: dict[str, list[Field]] = {g: [] for g in GROUPS}
    for f in ALL:
        out[f.group].append(f)
    return out


def default_text(f: Field) -> str:
    """A field's default as the help prints it."""
    if isinstance(f.default, PerDataset):
        return {"dataset": "the dataset's name", "run_name": "<dataset>_<variant>"}.get(
            f.default.key, "per dataset (its protocol)")
    return repr(f.default)


def help_text(group: str | None = None) -> str:
    """Every field (or one group's) with its type, default, allowed values and doc: what the
    train command's `--helpfull` prints and the reference's field page lists."""
    lines = []
    for name, members in fields_by_group().items():
        if group is not None and name != group:
            continue
        lines.append(f"{name}: {GROUPS[name]}")
        for f in members:
            allowed = f"; one of {', '.join(map(str, f.allowed))}" if f.allowed else ""
            lines.append(f"  --config.{f.name}  ({f.kind}, default {default_text(f)}{allowed})")
            lines.append(f"      {f.doc}")
        lines.append("")
    return "\n".join(lines)


def groups_text() -> str:
    """One line a group, with its fields' names: what `--help` shows."""
    return "\n".join(f"  {name}: {', '.join(f.name for f in members)}"
                     for name, members in fields_by_group().items())
